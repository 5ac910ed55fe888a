// Private: the counters behind attention_calls() (dscpp/kernels/attention_backend.h), bumped by the CUDA dispatch.
#pragma once
#include <atomic>
#include <cstdint>

namespace dscpp {

struct AttentionCallCounters {
  std::atomic<int64_t> cudnn_forward{0}, cudnn_backward{0}, own_forward{0}, own_backward{0};
};
AttentionCallCounters& attention_call_counters();

}  // namespace dscpp
