// The batch-size triple: DeepSpeed's derivation table and assertions (DeepSpeedConfig._set_batch_related_parameters
// and _batch_assertion), with its exact message texts. W is the data-parallel world size.
#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

// Python's // on ints rounds toward -inf; DeepSpeed's derivations use it, so negative inputs derive as in Python.
static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

static std::optional<int64_t> read_batch_key(const json& root, const char* key) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return std::nullopt;
  if (it->is_string() && it->get<std::string>() == "auto")
    fail(key, *it, "\"auto\" is only resolved by the Hugging Face Trainer; give a number");
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float() && it->get<double>() == double(int64_t(it->get<double>()))) return int64_t(it->get<double>());
  fail(key, *it, "expected an integer");
}

void resolve_batch_sizes(const json& root, int W, DeepSpeedConfig& out) {
  if (W < 1) throw ConfigError("", "DeepSpeed config: data-parallel world size must be >= 1, got " + std::to_string(W));
  auto tb = read_batch_key(root, "train_batch_size");
  auto mb = read_batch_key(root, "train_micro_batch_size_per_gpu");
  auto gas = read_batch_key(root, "gradient_accumulation_steps");
  auto str = [](int64_t x) { return std::to_string(x); };
  const std::string ranks = str(W) + (W == 1 ? " rank" : " ranks");

  // DeepSpeed's texts first (they are what users search for), then which key is wrong: one the user wrote, or
  // one derived from the others.
  auto not_positive = [&](const char* key, int64_t v, const std::string& why) {
    const std::string what = std::string(key) == "train_batch_size"              ? "Train batch size: "
                             : std::string(key) == "train_micro_batch_size_per_gpu" ? "Micro batch size per gpu: "
                                                                                    : "Gradient accumulation steps: ";
    throw ConfigError(key, what + str(v) + " has to be greater than 0 (" + why + ")");
  };
  const std::pair<const char*, std::optional<int64_t>> given[] = {
      {"train_batch_size", tb}, {"train_micro_batch_size_per_gpu", mb}, {"gradient_accumulation_steps", gas}};
  for (const auto& [key, v] : given)
    if (v && *v <= 0) not_positive(key, *v, std::string(key) + " = " + str(*v) + " in the config; it must be >= 1");

  std::string derived;  // how the missing value was computed, for the messages below
  if (tb && mb && gas) {
    // all given: only the assertion runs
  } else if (tb && mb) {
    gas = floordiv(floordiv(*tb, *mb), W);
    derived = "gradient_accumulation_steps = train_batch_size " + str(*tb) + " // train_micro_batch_size_per_gpu " +
              str(*mb) + " // " + ranks;
  } else if (tb && gas) {
    mb = floordiv(floordiv(*tb, W), *gas);
    derived = "train_micro_batch_size_per_gpu = train_batch_size " + str(*tb) + " // " + ranks +
              " // gradient_accumulation_steps " + str(*gas);
  } else if (mb && gas) {
    tb = *mb * *gas * W;
  } else if (tb) {
    gas = 1;
    mb = floordiv(*tb, W);
    derived = "train_micro_batch_size_per_gpu = train_batch_size " + str(*tb) + " // " + ranks;
  } else if (mb) {
    gas = 1;
    tb = *mb * W;
  } else {
    throw ConfigError("train_batch_size", "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  }

  // Only a derived value can still be below 1: train_batch_size is smaller than what it is divided by.
  const std::string rule = derived + " is 0: train_batch_size must be at least train_micro_batch_size_per_gpu x " +
                           "gradient_accumulation_steps x the data-parallel ranks";
  if (*mb <= 0) not_positive("train_micro_batch_size_per_gpu", *mb, rule);
  if (*gas <= 0) not_positive("gradient_accumulation_steps", *gas, rule);
  if (*tb != *mb * *gas * W)
    throw ConfigError("", "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                          "gradient_acc_step * world_size " + str(*tb) + " != " + str(*mb) + " * " + str(*gas) +
                          " * " + str(W));
  out.train_batch_size = *tb;
  out.train_micro_batch_size_per_gpu = *mb;
  out.gradient_accumulation_steps = *gas;
  out.dp_world_size = W;
}

}  // namespace dscpp::config_detail
