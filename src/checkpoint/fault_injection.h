// Fault injection for crash-consistency tests. The checkpoint writer calls checkpoint_fault_point() at the named
// points below; a test installs a hook that throws or _exit()s there (in a fork()ed child) and then proves the
// previous tag is still loadable and `latest` unchanged.
// The environment variable DSCPP_CHECKPOINT_CRASH_AT=<point name> makes the process _exit(86) at that point, so
// end-to-end tests can kill a real training run mid-save. Neither is meant for production use.
#pragma once
#include <functional>

namespace dscpp {

enum class FaultPoint {
  before_shard_write,  // multi-rank save (sharded_writer.h): this rank joined the save, nothing written yet
  after_tensor_write,  // after each tensor's bytes are written (the file is incomplete)
  before_manifest,     // all data files written and fsynced, manifest.json not yet written
  before_rename,       // "<tag>.tmp" complete and fsynced, not yet renamed to "<tag>"
  before_latest,       // "<tag>" in place, `latest` not yet updated
  before_shard_report, // multi-rank save, rank > 0: its files written and fsynced, not yet reported to rank 0
};
const char* fault_point_name(FaultPoint p);

using FaultHook = std::function<void(FaultPoint)>;
void set_checkpoint_fault_hook(FaultHook hook);  // empty clears it
void checkpoint_fault_point(FaultPoint p);       // runs the hook, then honours DSCPP_CHECKPOINT_CRASH_AT

}  // namespace dscpp
