// The "autotuning" section: DeepSpeed's DeepSpeedAutotuningConfig keys, checked by type and range, with the
// cross-key rules DeepSpeed leaves to a failed run (an empty profile window, min above max).
#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

static void parse_model_info(const json& j, AutotuningModelInfo& m) {
  SectionReader r(j, "autotuning.model_info");
  r.get("profile", m.profile);
  r.get("num_params", m.num_params, 1);
  r.get("hidden_size", m.hidden_size, 1);
  r.get("num_layers", m.num_layers, 1);
  r.finish();
}

void parse_autotuning(const json& j, AutotuningConfig& a) {
  SectionReader r(j, "autotuning");
  r.get("enabled", a.enabled);
  r.get("fast", a.fast);
  r.get("results_dir", a.results_dir);
  r.get("exps_dir", a.exps_dir);
  for (const char* k : {"results_dir", "exps_dir"})
    if (r.has(k) && r.raw(k)->get<std::string>().empty()) fail(r.path(k), "", "must name a folder");
  r.get("overwrite", a.overwrite);
  r.get("start_profile_step", a.start_profile_step, 0, int64_t(1) << 40);
  r.get("end_profile_step", a.end_profile_step, 1, int64_t(1) << 40);
  r.get("metric_path", a.metric_path);
  r.get("metric", a.metric, {"throughput", "latency", "flops", "FLOPS"});
  if (a.metric == "FLOPS") a.metric = "flops";  // DeepSpeed reads both spellings
  r.get("tuner_type", a.tuner_type, {"gridsearch", "random", "model_based"});
  r.get("tuner_early_stopping", a.tuner_early_stopping, 0);
  r.get("tuner_num_trials", a.tuner_num_trials, 1);
  if (const json* m = r.raw("arg_mappings"); m && !m->is_null()) {
    if (!m->is_object()) fail(r.path("arg_mappings"), *m, "expected an object of config key -> flag names");
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (!it->is_string() || it->get<std::string>().rfind("--", 0) != 0)
        fail(r.path("arg_mappings") + "." + it.key(), *it, "expected a flag name starting with \"--\"");
      a.arg_mappings[it.key()] = it->get<std::string>();
    }
  }
  r.get("max_train_batch_size", a.max_train_batch_size, 1);
  r.get("min_train_batch_size", a.min_train_batch_size, 1);
  r.get("max_train_micro_batch_size_per_gpu", a.max_train_micro_batch_size_per_gpu, 1);
  r.get("min_train_micro_batch_size_per_gpu", a.min_train_micro_batch_size_per_gpu, 1);
  r.get("num_tuning_micro_batch_sizes", a.num_tuning_micro_batch_sizes, 1);
  r.get("mp_size", a.mp_size, 1);
  r.get("model_info_path", a.model_info_path);
  if (const json* m = r.raw("model_info"); m && !m->is_null()) parse_model_info(*m, a.model_info);
  r.finish();

  if (a.end_profile_step <= a.start_profile_step)
    fail(r.path("end_profile_step"), a.end_profile_step,
         "must be > autotuning.start_profile_step (" + std::to_string(a.start_profile_step) +
             "): the steps between them are the ones timed");
  if (a.max_train_batch_size && *a.max_train_batch_size < a.min_train_batch_size)
    fail(r.path("max_train_batch_size"), *a.max_train_batch_size,
         "must be >= autotuning.min_train_batch_size (" + std::to_string(a.min_train_batch_size) + ")");
  if (a.max_train_micro_batch_size_per_gpu < a.min_train_micro_batch_size_per_gpu)
    fail(r.path("max_train_micro_batch_size_per_gpu"), a.max_train_micro_batch_size_per_gpu,
         "must be >= autotuning.min_train_micro_batch_size_per_gpu (" +
             std::to_string(a.min_train_micro_batch_size_per_gpu) + ")");
  if (a.mp_size != 1)
    fail(r.path("mp_size"), a.mp_size, "DeepSpeed.cpp trains without tensor or pipeline parallelism: must be 1");
}

}  // namespace dscpp::config_detail
