#include "dscpp/autotune/micro_batch.h"

#include <algorithm>

#include "dscpp/runtime/config.h"

namespace dscpp::autotune {

namespace {
std::optional<int64_t> positive_int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null() || (it->is_string() && *it == "auto")) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    throw ConfigError(key, std::string("DeepSpeed config: ") + key + " = " + it->dump() + ": must be a whole "
                      "number >= 1 (the micro-batch search keeps it)");
  return it->get<int64_t>();
}
}  // namespace

bool BatchRules::allowed(int64_t mbs) const {
  if (mbs < min_mbs || mbs > max_mbs) return false;
  if (per_rank) return *per_rank % mbs == 0;
  const int64_t global = mbs * gas * world;
  return global >= min_global && (!max_global || global <= *max_global);
}

int64_t BatchRules::gas_for(int64_t mbs) const { return per_rank ? *per_rank / mbs : gas; }

std::vector<int64_t> BatchRules::allowed_list() const {
  std::vector<int64_t> out;
  for (int64_t m = min_mbs; m <= max_mbs; m++)
    if (allowed(m)) out.push_back(m);
  return out;
}

std::string BatchRules::describe() const {
  if (per_rank)
    return "train_batch_size " + std::to_string(*per_rank * world) + " fixed: micro-batch x gradient accumulation = " +
           std::to_string(*per_rank) + " per rank";
  std::string s = "gradient_accumulation_steps " + std::to_string(gas) + " kept; the global batch follows the "
                  "micro-batch";
  if (max_global) s += " up to " + std::to_string(*max_global);
  return s;
}

BatchRules batch_rules(const nlohmann::json& user, const AutotuningConfig& at, int world) {
  BatchRules r;
  r.world = world;
  r.min_mbs = at.min_train_micro_batch_size_per_gpu;
  r.max_mbs = at.max_train_micro_batch_size_per_gpu;
  r.min_global = at.min_train_batch_size;
  r.max_global = at.max_train_batch_size;
  if (const auto tbs = positive_int(user, "train_batch_size")) {
    if (*tbs % world != 0)
      throw ConfigError("train_batch_size", "DeepSpeed config: train_batch_size = " + std::to_string(*tbs) +
                        ": must be a multiple of the " + std::to_string(world) + " data-parallel ranks of a trial "
                        "(its ranks over tensor_parallel.autotp_size x pipeline.stages)");
    r.per_rank = *tbs / world;
  } else if (const auto gas = positive_int(user, "gradient_accumulation_steps")) {
    r.gas = *gas;
  }
  if (auto m = user.find("train_micro_batch_size_per_gpu"); m != user.end() && !m->is_array())
    positive_int(user, "train_micro_batch_size_per_gpu");  // checked only: the search sets it (a list: space.h)
  if (r.allowed_list().empty())
    throw ConfigError("autotuning.max_train_micro_batch_size_per_gpu",
                      "autotuning: no micro-batch from " + std::to_string(r.min_mbs) + " to " +
                          std::to_string(r.max_mbs) + " (autotuning.{min,max}_train_micro_batch_size_per_gpu) meets " +
                          r.describe() + " within autotuning.{min,max}_train_batch_size on " + std::to_string(world) +
                          " rank(s)");
  return r;
}

int64_t largest_fitting(const BatchRules& rules, const std::function<bool(int64_t)>& fits) {
  const std::vector<int64_t> a = rules.allowed_list();
  size_t lo = 0, hi = a.size();  // fits(a[i]) for i < lo; not for i >= hi
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fits(a[mid])) lo = mid + 1;
    else hi = mid;
  }
  return lo == 0 ? 0 : a[lo - 1];
}

std::vector<int64_t> tuning_micro_batch_sizes(const BatchRules& rules, int64_t most, int64_t num) {
  if (most <= 0) return {};
  const int64_t lo = std::max(rules.min_mbs, most / 2);
  const int64_t stride = std::max<int64_t>(1, (most - lo) / std::max<int64_t>(1, num));
  std::vector<int64_t> out;
  for (int64_t m = lo; m < most; m += stride)
    if (rules.allowed(m) && (!rules.per_rank || rules.gas_for(m) != rules.gas_for(most))) out.push_back(m);
  out.push_back(most);
  return out;
}

std::vector<int64_t> refinement_micro_batches(const BatchRules& rules, const std::vector<int64_t>& list) {
  if (list.empty()) return {};
  const int64_t most = list.back();
  const int64_t lo = list.size() > 1 ? list[list.size() - 2] + 1 : rules.min_mbs;
  const int64_t stride = std::max<int64_t>(1, (most - lo) / 3);
  std::vector<int64_t> out;
  for (int64_t m = lo; m < most; m += stride)
    if (rules.allowed(m)) out.push_back(m);
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace dscpp::autotune
