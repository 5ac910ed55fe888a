#include "dscpp/inference/scheduling.h"

namespace dscpp::inference {

const char* scheduling_result_name(SchedulingResult r) {
  switch (r) {
    case SchedulingResult::Success: return "Success";
    case SchedulingResult::EngineSequenceLimitExceeded: return "EngineSequenceLimitExceeded";
    case SchedulingResult::BatchSequenceLimitExceeded: return "BatchSequenceLimitExceeded";
    case SchedulingResult::BatchTokenLimitExceeded: return "BatchTokenLimitExceeded";
    case SchedulingResult::KVCacheLimitExceeded: return "KVCacheLimitExceeded";
    case SchedulingResult::SequenceTokenLimitExceeded: return "SequenceTokenLimitExceeded";
  }
  return "Unknown";
}

}  // namespace dscpp::inference
