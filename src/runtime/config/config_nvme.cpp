// The "aio" section (DeepSpeed runtime/swap_tensor/aio_config.py: code defaults, thread_count as the legacy name of
// intra_op_parallelism) and the rules of NVMe optimizer offload that span sections (Note [NVMe optimizer states],
// runtime/offload/nvme_states.h), all checked before the engine does any work.
#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

void parse_aio(const json& j, AioConfig& a) {
  SectionReader r(j, "aio");
  r.get("block_size", a.block_size, INT64_MIN, INT64_MAX);
  if (a.block_size <= 0 || a.block_size % 4096 != 0)
    fail(r.path("block_size"), a.block_size, "must be a positive multiple of 4096: swap files are read and written "
         "with O_DIRECT, in requests of this many bytes");
  r.get("queue_depth", a.queue_depth, 1, 32768);
  if (r.has("thread_count") && r.has("intra_op_parallelism"))
    throw ConfigError(r.path("thread_count"), "DeepSpeed config: give only one of aio.thread_count and "
                      "aio.intra_op_parallelism (its new name)");
  r.get("thread_count", a.intra_op_parallelism, 1, 256);
  r.get("intra_op_parallelism", a.intra_op_parallelism, 1, 256);
  r.get("single_submit", a.single_submit);
  r.get("overlap_events", a.overlap_events);
  r.get("use_gds", a.use_gds);
  r.finish();
  if (a.use_gds)
    fail(r.path("use_gds"), true, "GPUDirect Storage is not supported by DeepSpeed.cpp: swap files go through "
         "page-locked host buffers (remove the key or set it to false)");
}


void check_nvme_offload(const DeepSpeedConfig& c) {
  const std::string& backend = c.dscpp.offload.aio_backend;
  for (AioBackend b : {AioBackend::io_uring, AioBackend::libaio})
    if (backend == aio_backend_name(b) && !aio_backend_built(b))
      fail("dscpp.offload.aio_backend", backend, std::string("this build has no ") +
           (b == AioBackend::io_uring ? "liburing (install liburing-dev" : "libaio (install libaio-dev") +
           " and rebuild), or use \"auto\"");
  const auto& o = c.zero_optimization.offload_optimizer;
  if (!o || o->device != "nvme" || !o->enabled()) return;
  const std::string key = "zero_optimization.offload_optimizer";
  const std::string missing = aio_missing_libraries();
  if (!missing.empty()) fail(key + ".device", "nvme", missing);
  if (c.dscpp.offload.delayed_update)
    throw ConfigError("dscpp.offload.delayed_update", "dscpp.offload.delayed_update: the delayed parameter update "
                      "keeps the whole shard's update in host memory until the next step; it needs "
                      "zero_optimization.offload_optimizer.device \"cpu\", not \"nvme\"");
  if (c.zero_optimization.sub_group_size < 1)
    fail("zero_optimization.sub_group_size", c.zero_optimization.sub_group_size,
         "must be >= 1 with offload_optimizer.device \"nvme\": the optimizer is swapped in sub-groups of this many "
         "elements");
  // DeepSpeed's buffer_count counts buffers of the largest sub-group: one per swapped tensor of each sub-group in
  // memory, i.e. the f32 weights and each optimizer state, and a sub-group in memory per pipelined direction.
  const int per_group = 1 + c.optimizer.states_per_element();
  const int groups = 1 + int(o->pipeline_read) + int(o->pipeline_write);
  if (o->buffer_count < int64_t(per_group) * groups)
    fail(key + ".buffer_count", o->buffer_count,
         "too few for device \"nvme\": a sub-group in memory takes " + std::to_string(per_group) +
         " buffers (its f32 weights and " + std::to_string(per_group - 1) + " optimizer state(s)), and " +
         std::to_string(groups) + " sub-group(s) are in memory at once (one stepping" +
         (o->pipeline_read ? ", the next being read" : "") + (o->pipeline_write ? ", the last being written" : "") +
         "): set it to at least " + std::to_string(per_group * groups));
}

}  // namespace dscpp::config_detail
