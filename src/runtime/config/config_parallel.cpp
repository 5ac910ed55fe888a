// The "pipeline" and "tensor_parallel" sections, and the data-parallel size they leave.
//
// Note [Parallel degrees]
// A job of W ranks is laid out as pp x dp x tp (comm/topology.h): tp = tensor_parallel.autotp_size (else
// tensor_parallel.tp.tp_size, the key the inference config reads too), pp = pipeline.stages ("auto" = 1), and
// dp = W / (tp x pp). The batch triple uses dp, as DeepSpeed's does (mpu.get_data_parallel_world_size()):
// train_batch_size = micro x gas x dp, since the tp x pp ranks of one replica see the same micro-batches.
// `dscpp train --tp / --pp` override the keys before parsing.
#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

void parse_pipeline(const json& j, PipelineConfig& p) {
  SectionReader r(j, "pipeline");
  r.get("stages", p.stages, 1, 4096);
  if (r.get("partition", p.partition)) {
    std::string m = p.partition;
    for (char& ch : m) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (m.rfind("type:", 0) == 0)
      fail(r.path("partition"), p.partition, "DeepSpeed's \"type:regex\" partitioning balances layers whose class "
                                             "name matches; our models have no such names: use \"parameters\" or "
                                             "\"uniform\"");
    if (m != "parameters" && m != "uniform" && m != "best")
      fail(r.path("partition"), p.partition, "expected \"parameters\", \"uniform\" or \"best\" (= \"parameters\")");
    p.partition = m == "best" ? "parameters" : m;
  }
  r.get("seed_layers", p.seed_layers);
  if (r.get("activation_checkpoint_interval", p.activation_checkpoint_interval, 0) &&
      p.activation_checkpoint_interval > 1)
    fail(r.path("activation_checkpoint_interval"), p.activation_checkpoint_interval,
         "DeepSpeed recomputes runs of that many layers as one segment, keeping only each run's input; our blocks "
         "are checkpointed one at a time with the residual stream kept (Note [Activation memory], "
         "src/models/decoder.h): use 1 (every block of every stage recomputes) or 0, or "
         "activation_checkpointing.number_checkpoints to recompute fewer blocks");
  r.get("pipe_partitioned", p.pipe_partitioned);
  r.get("grad_partitioned", p.grad_partitioned);
  r.finish();
}

void parse_tensor_parallel(const json& j, TensorParallelConfig& t, std::vector<std::string>* warnings) {
  SectionReader r(j, "tensor_parallel");
  r.get("autotp_size", t.autotp_size, 0, 4096);
  if (const json* v = r.raw("tp_size"))  // the inference config's spelling, one level up
    fail(r.path("tp_size"), *v, "the training config's tensor-parallel degree is tensor_parallel.autotp_size (or "
                                "tensor_parallel.tp.tp_size); tensor_parallel.tp_size is the inference config's key");
  if (const json* d = r.raw("dtype"); d && !d->is_null())
    warn(warnings, r.path("dtype") + " = " + value_str(*d) + " is ignored: the model's dtype follows the fp16 and "
                   "bf16 sections");
  if (const json* v = r.raw("injection_policy_tuple"); v && !v->is_null())
    fail(r.path("injection_policy_tuple"), *v, "AutoTP injection policies have no counterpart: our models split "
                                               "their layers themselves (use null)");
  const char* name = "tp";
  if (r.has("tp") && r.has("tensor_parallel"))
    throw ConfigError("tensor_parallel.tensor_parallel", "DeepSpeed config: give only one of tensor_parallel.tp "
                      "and tensor_parallel.tensor_parallel (its alias)");
  const json* sub = r.raw("tp");
  if (const json* alias = r.raw("tensor_parallel"); !sub && alias) sub = alias, name = "tensor_parallel";
  std::string tp_path = r.path(name);
  bool tp_size_given = false;
  if (sub) {
    SectionReader s(*sub, tp_path);
    s.get("enabled", t.tp_enabled);
    tp_size_given = s.get("tp_size", t.tp_size, 1, 4096);  // the inference config's range too
    s.get("tp_grain_size", t.tp_grain_size, 1);
    for (const char* k : {"mpu", "tp_group"})
      if (const json* v = s.raw(k); v && !v->is_null())
        fail(s.path(k), *v, "a Python object; our groups come from the topology (use null)");
    s.finish();
  }
  r.finish();
  if (t.autotp_size > 0 && tp_size_given && t.tp_enabled && t.tp_size != 1 && t.tp_size != t.autotp_size)
    throw ConfigError(r.path("autotp_size"), "tensor_parallel.autotp_size = " + std::to_string(t.autotp_size) +
                      " and " + tp_path + ".tp_size = " + std::to_string(t.tp_size) + " disagree: the training "
                      "tensor-parallel degree is autotp_size when set; give one of them, or the same value");
}

int data_parallel_size(const DeepSpeedConfig& c, int world_size) {
  const int tp = c.tp_size(), pp = c.pp_size();
  if (world_size % (tp * pp) == 0) return world_size / (tp * pp);
  const std::string key = pp > 1 ? "pipeline.stages" : "tensor_parallel.autotp_size";
  throw ConfigError(key, "DeepSpeed config: tensor_parallel degree " + std::to_string(tp) + " x pipeline.stages " +
                    std::to_string(pp) + " = " + std::to_string(tp * pp) + " does not divide the world size " +
                    std::to_string(world_size) + ": the ranks form tp x pp x dp (dp = world / (tp x pp))");
}

}  // namespace dscpp::config_detail
