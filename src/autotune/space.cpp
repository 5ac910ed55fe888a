// Note [Inert keys]: several keys of DeepSpeed's tuning spaces change nothing in our engine, and at one data-parallel
// rank (one rank per trial, or a tp x pp layout that takes every rank) neither do the ZeRO stages: stages 1-3
// partition over one rank, which is stage 0 (stage 1 when the optimizer is offloaded, stage 3 when the parameters
// are: the one thing a stage adds there). Trials that differ only in such keys would time the same run
// twice and rank noise. So every choice is first put in its canonical form: the stage the engine really runs, and
// the keys that have no effect there removed (the base value then applies). Choices whose canonical configs are
// equal are one trial; the report counts the rest, by key. The keys, and why (docs/CONFIG.md, zero_optimization):
//   allgather_bucket_size, allgather_partitions   stages 1-3 all-gather whole blocks: always
//   contiguous_gradients, reduce_scatter           gradients are reduce-scattered per block into a flat partition:
//                                                  always
//   reduce_bucket_size                             sizes stage 0's buckets only: stages 1-3, or one dp rank
//   overlap_comm                                   nothing to overlap on one dp rank
//   stage3_*                                       stage 3 at two dp ranks or more only
//   offload_param.device                           stage 3 only
//   dscpp.attention                                chooses among CUDA kernels: CPU runs
//   dscpp.sequence_parallel                        splits rows over the tensor-parallel ranks: tp 1
//   dscpp.pipeline.virtual_stages                  interleaves pipeline stages: pp 1
// A key that starts to matter leaves this list.
//
// Note [Layouts]: with several ranks per trial, the default space holds the tensor-parallel degree
// (tensor_parallel.autotp_size, what `dscpp train --tp` sets) and the pipeline stages (pipeline.stages, --pp) at
// 1, 2, 4, ... up to the ranks of a trial, each crossed with the other keys; dp = ranks / (tp x pp) is the
// data-parallel size the batch rules and ZeRO see. A layout the ranks cannot hold is pruned before the memory
// estimate, with its reason (autotuner.cpp, layout_problem): tp x pp not dividing the ranks, more stages than the
// model's layers, a tp that does not divide its heads, KV heads or MLP width, a train_batch_size the dp ranks do
// not divide, the fused head or offload under tp or pp (the trainer and the engine refuse them).
#include "dscpp/autotune/space.h"

#include <algorithm>
#include <cstdio>

#include "dscpp/runtime/config.h"

namespace dscpp::autotune {

namespace {

enum class Kind { boolean, size, text, checkpoints, degree };

struct Tunable {
  const char* path;
  Kind kind;
  std::vector<json> defaults;  // the default space's values (empty: only a user's list tunes it)
  int first_stage, last_stage;  // the stages whose default space holds it
  bool cuda_only;
};

const std::vector<Tunable>& tunables() {
  static const std::vector<Tunable> t = {
      {"zero_optimization.reduce_bucket_size", Kind::size, {50000000, 500000000, 1000000000}, 0, 3, false},
      {"zero_optimization.allgather_bucket_size", Kind::size, {50000000, 500000000, 1000000000}, 1, 3, false},
      {"zero_optimization.overlap_comm", Kind::boolean, {true, false}, 0, 3, false},
      {"zero_optimization.reduce_scatter", Kind::boolean, {false, true}, 2, 3, false},
      {"zero_optimization.contiguous_gradients", Kind::boolean, {false, true}, 2, 3, false},
      {"zero_optimization.allgather_partitions", Kind::boolean, {true, false}, 3, 3, false},
      {"zero_optimization.stage3_prefetch_bucket_size", Kind::size, {50000000, 500000000}, 3, 3, false},
      {"zero_optimization.stage3_param_persistence_threshold", Kind::size, {100000, 1000000}, 3, 3, false},
      {"zero_optimization.stage3_max_live_parameters", Kind::size, {}, 3, 3, false},
      {"zero_optimization.stage3_max_reuse_distance", Kind::size, {}, 3, 3, false},
      {"zero_optimization.offload_optimizer.device", Kind::text, {"none", "cpu", "nvme"}, 1, 3, true},
      {"zero_optimization.offload_param.device", Kind::text, {"none", "cpu", "nvme"}, 3, 3, true},
      {"tensor_parallel.autotp_size", Kind::degree, {"degrees"}, 0, 3, false},
      {"pipeline.stages", Kind::degree, {"degrees"}, 0, 3, false},
      {"activation_checkpointing.number_checkpoints", Kind::checkpoints, {nullptr, "every"}, 0, 3, false},
      {"dscpp.fused_head", Kind::boolean, {false, true}, 0, 3, false},
      {"dscpp.attention", Kind::text, {"auto", "own"}, 0, 3, true},
      {"dscpp.sequence_parallel", Kind::boolean, {false, true}, 0, 3, false},
      {"dscpp.pipeline.virtual_stages", Kind::size, {}, 0, 3, false},
  };
  return t;
}

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0, dot;
  while ((dot = path.find('.', start)) != std::string::npos) parts.push_back(path.substr(start, dot - start)), start = dot + 1;
  parts.push_back(path.substr(start));
  return parts;
}

// A listed value of the kind the key takes, or a ConfigError naming the key (the trial's own parse checks ranges).
void check_listed(const Tunable& t, const json& v) {
  const bool ok = t.kind == Kind::boolean     ? v.is_boolean()
                  : t.kind == Kind::text      ? v.is_string()
                  : t.kind == Kind::checkpoints ? (v.is_null() || v.is_number_integer())
                  : t.kind == Kind::degree    ? v.is_number_integer() && v.get<int64_t>() >= 1
                                                : v.is_number() && v.get<double>() >= 0;
  if (!ok)
    throw ConfigError(t.path, std::string("DeepSpeed config: ") + t.path + " = " + v.dump() +
                                  ": a listed value must be " +
                                  (t.kind == Kind::boolean ? "true or false" : t.kind == Kind::text ? "a string"
                                   : t.kind == Kind::checkpoints ? "null or a block count"
                                   : t.kind == Kind::degree ? "a whole number >= 1" : "a number >= 0"));
}

json as_config_value(const json& v) {  // 5e8 written as a float is an integer size
  if (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))) return int64_t(v.get<double>());
  return v;
}

std::vector<int> parse_stages(const json& s) {
  const std::string key = "zero_optimization.stage";
  std::vector<int> out;
  auto one = [&](const json& v) {
    if (v.is_string() && v.get<std::string>() == "all") {
      for (int i = 0; i <= 3; i++) out.push_back(i);
      return;
    }
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 3)
      throw ConfigError(key, "DeepSpeed config: " + key + " = " + s.dump() + ": each stage must be 0, 1, 2, 3 "
                             "or \"all\"");
    out.push_back(int(v.get<int64_t>()));
  };
  if (s.is_array()) {
    if (s.empty()) throw ConfigError(key, "DeepSpeed config: " + key + " = []: list at least one stage");
    for (const auto& v : s) one(v);
  } else {
    one(s);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string value_text(const json& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "T" : "F";
  if (v.is_number() && v.get<double>() > 9000) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1e", v.get<double>());
    return b;
  }
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string initials(const std::string& path) {
  if (path == "zero_optimization.offload_optimizer.device") return "oo";  // DeepSpeed's offload prefix
  if (path == "zero_optimization.offload_param.device") return "op";
  if (path == "tensor_parallel.autotp_size") return "tp";
  if (path == "pipeline.stages") return "pp";
  const std::string key = split(path).back();
  std::string s;
  for (size_t i = 0; i < key.size(); i++)
    if (key[i] != '_' && (i == 0 || key[i - 1] == '_')) s += key[i];
  return s;
}

// dp: the data-parallel ranks of the choice's layout, the ranks ZeRO partitions and reduces over.
bool inert(const std::string& path, int stage, int dp, const SpaceContext& ctx) {
  const std::string key = split(path).back();
  if (key == "allgather_bucket_size" || key == "allgather_partitions" || key == "contiguous_gradients" ||
      key == "reduce_scatter")
    return true;
  if (key == "reduce_bucket_size") return stage >= 1 || dp == 1;
  if (key == "overlap_comm") return dp == 1;
  if (key.rfind("stage3_", 0) == 0) return stage != 3 || dp == 1;
  if (path == "zero_optimization.offload_param.device") return stage != 3;
  if (path == "dscpp.attention") return !ctx.cuda;
  return false;
}

// A key's value in the choice, else in the base config (nullptr: neither sets it).
const json* chosen(const Choice& c, const json& base, const std::string& path) {
  auto it = c.find(path);
  return it != c.end() ? &it->second : find_path(base, path);
}

bool offloaded(const Choice& c, const json& base, const std::string& path) {
  const json* d = chosen(c, base, path);
  return d && d->is_string() && *d != "none";
}

}  // namespace

const json* find_path(const json& j, const std::string& path) {
  const json* cur = &j;
  for (const auto& part : split(path)) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(part);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

void set_path(json& j, const std::string& path, const json& value) {
  const std::vector<std::string> parts = split(path);
  json* cur = &j;
  for (size_t i = 0; i + 1 < parts.size(); i++) {
    if (!cur->contains(parts[i]) || !(*cur)[parts[i]].is_object()) {
      if (value.is_null()) return;  // nothing to erase
      (*cur)[parts[i]] = json::object();
    }
    cur = &(*cur)[parts[i]];
  }
  if (value.is_null()) cur->erase(parts.back());
  else (*cur)[parts.back()] = value;
}

UserSpace split_user_config(const json& user) {
  if (!user.is_object()) throw ConfigError("", "DeepSpeed config: expected a JSON object, got " + user.dump());
  UserSpace u;
  u.base = user;
  u.base.erase("autotuning");
  json& zero = u.base["zero_optimization"];
  if (zero.is_boolean()) zero = zero.get<bool>() ? json{{"stage", 1}} : json::object();  // legacy true = stage 1
  if (zero.is_null()) zero = json::object();
  u.stages = zero.contains("stage") ? parse_stages(zero["stage"]) : std::vector<int>{0, 1, 2, 3};
  zero.erase("stage");
  if (const json* g = find_path(u.base, "gradient_accumulation_steps"); g && g->is_array())
    throw ConfigError("gradient_accumulation_steps", "DeepSpeed config: gradient_accumulation_steps = " + g->dump() +
                      ": a list is not tuned (the micro-batch search sets it at a fixed train_batch_size, "
                      "else keeps the config's value)");
  if (const json* m = find_path(u.base, "train_micro_batch_size_per_gpu"); m && m->is_array()) {
    for (const auto& v : *m) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        throw ConfigError("train_micro_batch_size_per_gpu", "DeepSpeed config: train_micro_batch_size_per_gpu = " +
                          m->dump() + ": each listed micro-batch must be a whole number >= 1");
      u.micro_batches.push_back(v.get<int64_t>());
    }
    std::sort(u.micro_batches.begin(), u.micro_batches.end());
    u.micro_batches.erase(std::unique(u.micro_batches.begin(), u.micro_batches.end()), u.micro_batches.end());
  }
  for (const char* k : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"})
    u.base.erase(k);  // make_config sets all three
  for (const Tunable& t : tunables()) {
    const json* v = find_path(u.base, t.path);
    if (!v || !v->is_array()) continue;
    if (v->empty()) throw ConfigError(t.path, std::string("DeepSpeed config: ") + t.path + " = []: list a value");
    Dimension d{t.path, {}, true};
    for (const auto& x : *v) check_listed(t, x), d.values.push_back(as_config_value(x));
    u.lists.push_back(std::move(d));
    set_path(u.base, t.path, nullptr);
  }
  return u;
}

std::vector<Dimension> stage_dimensions(int stage, const UserSpace& user, const SpaceContext& ctx) {
  std::vector<Dimension> dims;
  for (const Tunable& t : tunables()) {
    auto listed = std::find_if(user.lists.begin(), user.lists.end(), [&](const Dimension& d) { return d.path == t.path; });
    if (listed != user.lists.end()) {
      dims.push_back(*listed);
      continue;
    }
    if (find_path(user.base, t.path) || t.defaults.empty()) continue;  // fixed by the user, or not in a default space
    if (t.kind == Kind::degree && find_path(user.base, "tensor_parallel.tp.tp_size") &&
        std::string(t.path) == "tensor_parallel.autotp_size")
      continue;  // fixed by the user in the inference spelling
    if (stage < t.first_stage || stage > t.last_stage || (t.cuda_only && !ctx.cuda)) continue;
    if (t.kind == Kind::degree && ctx.world == 1) continue;  // one rank holds one layout
    Dimension d{t.path, {}, false};
    for (const json& v : t.defaults) {
      if (v == "every") {
        d.values.push_back(ctx.n_layer);  // activation checkpointing of every block
      } else if (v == "degrees") {
        for (int k = 1; k <= ctx.world; k *= 2) d.values.push_back(k);  // Note [Layouts]
      } else if (v == "nvme") {  // a swap folder is the user's to name: NVMe joins the space once it is given
        const std::string path = t.path, dir = path.substr(0, path.rfind('.')) + ".nvme_path";
        if (find_path(user.base, dir)) d.values.push_back(v);
      } else {
        d.values.push_back(v);
      }
    }
    dims.push_back(std::move(d));
  }
  return dims;
}

std::vector<Choice> all_choices(const std::vector<Dimension>& dims) {
  std::vector<Choice> out(1);
  for (const Dimension& d : dims) {
    std::vector<Choice> next;
    for (const Choice& c : out)
      for (const json& v : d.values) {
        Choice n = c;
        n[d.path] = v;
        next.push_back(std::move(n));
      }
    out = std::move(next);
  }
  return out;
}

int layout_degree(const Choice& c, const json& base, const std::string& path) {
  const json* v = chosen(c, base, path);
  if (path == "tensor_parallel.autotp_size" && (!v || (v->is_number_integer() && *v == 0)))
    v = find_path(base, "tensor_parallel.tp.tp_size");  // the inference spelling, when autotp_size is unset
  return v && v->is_number_integer() && v->get<int64_t>() >= 1 ? int(v->get<int64_t>()) : 1;
}

int data_parallel_ranks(const Choice& c, const json& base, int world) {
  const int mp = layout_degree(c, base, "tensor_parallel.autotp_size") * layout_degree(c, base, "pipeline.stages");
  return world % mp == 0 ? world / mp : 0;
}

Choice first_choice(const UserSpace& user) {
  Choice first;  // DeepSpeed's get_first_config: each listed key at its first value
  for (const Dimension& d : user.lists) first[d.path] = d.values[0];
  return first;
}

int canonical_choice(int stage, Choice& choice, const json& base, const SpaceContext& ctx,
                     std::vector<std::string>* why) {
  auto note = [&](const std::string& s) {
    if (why) why->push_back(s);
  };
  const int dp_or_0 = data_parallel_ranks(choice, base, ctx.world);
  const int dp = dp_or_0 ? dp_or_0 : ctx.world;  // a layout that does not divide is pruned later, with its reason
  const bool opt_off = offloaded(choice, base, "zero_optimization.offload_optimizer.device");
  const bool param_off = offloaded(choice, base, "zero_optimization.offload_param.device");
  int eff = stage;
  // One data-parallel rank partitions nothing: stage 0, or what offload needs (1: the optimizer, 3: the parameters).
  if (dp == 1 && stage >= 1 && !(stage == 3 && param_off) && !(opt_off && stage == 1)) {
    eff = opt_off ? 1 : 0;
    note((ctx.world == 1 ? std::string("one rank") : "one data-parallel rank (tp x pp = " + std::to_string(ctx.world) +
                                                          " ranks)") +
         ": ZeRO stage " + std::to_string(stage) + " partitions nothing, it runs as stage " + std::to_string(eff));
  }
  const bool tp1 = layout_degree(choice, base, "tensor_parallel.autotp_size") == 1;
  const bool pp1 = layout_degree(choice, base, "pipeline.stages") == 1;
  for (auto it = choice.begin(); it != choice.end();) {
    const bool no_offload_at_0 = it->first == "zero_optimization.offload_optimizer.device" && eff == 0;
    if ((it->first == "dscpp.sequence_parallel" && tp1) || (it->first == "dscpp.pipeline.virtual_stages" && pp1)) {
      note(it->first + ": no effect without " +
           (it->first == "dscpp.sequence_parallel" ? "tensor parallelism (tp 1)" : "pipeline stages (pp 1)"));
      it = choice.erase(it);
    } else if (inert(it->first, eff, dp, ctx) || no_offload_at_0) {
      note(it->first + ": no effect at stage " + std::to_string(eff) +
           (dp == 1 ? ctx.world == 1 ? " on one rank" : " on one data-parallel rank" : "") +
           (ctx.cuda ? "" : " on the CPU"));
      it = choice.erase(it);
    } else {
      ++it;
    }
  }
  return eff;
}

json make_config(const UserSpace& user, int stage, const Choice& choice, int64_t mbs, int64_t gas, int dp) {
  json c = user.base;
  set_path(c, "zero_optimization.stage", stage);
  for (const auto& [path, v] : choice) set_path(c, path, v);
  c["train_micro_batch_size_per_gpu"] = mbs;
  c["gradient_accumulation_steps"] = gas;
  c["train_batch_size"] = mbs * gas * dp;
  return c;
}

std::string experiment_name(int stage, const Choice& choice, const std::vector<std::string>& tuned, int64_t gas,
                            int64_t mbs) {
  std::string name = "z";
  name += std::to_string(stage);
  std::vector<std::string> keys = tuned;
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) {
    auto it = choice.find(k);
    if (it == choice.end()) continue;  // a key with no effect here (Note [Inert keys])
    name += '_';
    name += initials(k);
    name += value_text(it->second);
  }
  return name + "_gas" + std::to_string(gas) + "_tmbspg" + std::to_string(mbs);
}

}  // namespace dscpp::autotune
