#include "checkpoint/fault_injection.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace dscpp {

namespace {
FaultHook& hook() {
  static FaultHook h;
  return h;
}
}  // namespace

const char* fault_point_name(FaultPoint p) {
  switch (p) {
    case FaultPoint::after_tensor_write: return "after_tensor_write";
    case FaultPoint::before_manifest: return "before_manifest";
    case FaultPoint::before_rename: return "before_rename";
    case FaultPoint::before_latest: return "before_latest";
    case FaultPoint::before_shard_write: return "before_shard_write";
    case FaultPoint::before_shard_report: return "before_shard_report";
  }
  return "?";
}

void set_checkpoint_fault_hook(FaultHook h) { hook() = std::move(h); }

void checkpoint_fault_point(FaultPoint p) {
  if (hook()) hook()(p);
  // Simulated crash for end-to-end tests: no destructors, no stdio flush, like a kill -9.
  const char* env = std::getenv("DSCPP_CHECKPOINT_CRASH_AT");
  if (env && std::strcmp(env, fault_point_name(p)) == 0) _exit(86);
}

}  // namespace dscpp
