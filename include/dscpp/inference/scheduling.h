// FastGen's scheduling verdicts (inference/v2/scheduling_utils.py): what can_schedule answers for a proposed batch,
// and the error a put that cannot be scheduled throws. The codes are DeepSpeed's, so logs and clients compare.
#pragma once
#include <cstdint>
#include <string>

#include "dscpp/core/check.h"

namespace dscpp::inference {

enum class SchedulingResult : int {
  Success = 0,
  EngineSequenceLimitExceeded = 1,  // more tracked sequences than state_manager.max_tracked_sequences
  BatchSequenceLimitExceeded = 2,   // more sequences in the batch than max_ragged_sequence_count
  BatchTokenLimitExceeded = 3,      // more tokens in the batch than max_ragged_batch_size
  KVCacheLimitExceeded = 4,         // more KV blocks than are free (or evictable from the prefix cache)
  SequenceTokenLimitExceeded = 5,   // a sequence would hold more than max_context tokens
};

const char* scheduling_result_name(SchedulingResult r);  // "KVCacheLimitExceeded"

struct SchedulingError : Error {
  SchedulingError(SchedulingResult r, const std::string& detail)
      : Error(std::string("Batch scheduling failed with result SchedulingResult.") + scheduling_result_name(r) +
              " (" + std::to_string(int(r)) + "): " + detail),
        result(r) {}
  SchedulingResult result;  // never Success
};

}  // namespace dscpp::inference
