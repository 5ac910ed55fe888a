// The engine's sampler for a batch: every wanted row of a forward's logits sampled by the ops of
// include/dscpp/kernels/sampling_ops.h on the logits' device, so only token ids (and log-probabilities when asked)
// cross to the host. The rows' parameters and histories are packed into one host buffer (pinned when the logits are
// on a device) and uploaded in one copy; the results come back in one copy, then one stream sync. The buffers are
// kept and grow with the batch. On host logits the same ops run on the CPU: SequenceSampler::sample is this on one
// row, so the CPU and the GPU share one definition of a draw.
#pragma once
#include <vector>

#include "dscpp/core/tensor.h"
#include "dscpp/inference/sampler.h"

namespace dscpp {

class BatchSampler {
 public:
  // logits f32 [S, V] on the host or a device; rows[s] samples row s and records its token (nullptr: no token
  // wanted, result token -1). Not thread-safe: one BatchSampler per engine.
  std::vector<SampleResult> sample(const Tensor& logits, const std::vector<SequenceSampler*>& rows);
  // How long the last sample() waited for the device (the logits' forward and the sampling kernels); 0 on the host.
  double last_wait_seconds() const { return wait_; }

 private:
  Tensor in_host_, in_dev_;    // packed parameters (i32 words)
  Tensor out_dev_, out_host_;  // tokens, chosen log-probabilities, top ids, top log-probabilities (i32 words)
  Tensor penalized_;           // f32 [S, V] on the logits' device
  double wait_ = 0;
};

}  // namespace dscpp
