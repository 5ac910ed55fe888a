// Note [Frozen weights]
// Inference never writes its weights, so a decode GEMV may read its weight before the kernel ahead of it in the
// stream has finished: on sm_90 it is launched as a programmatic dependent (PDL), streams its first weight bytes
// while that kernel's last CTAs run, and only then waits for the inputs (griddepcontrol.wait). The kernels that
// precede GEMVs at decode (norms, paged attention, SwiGLU) let their dependents launch as soon as they start.
// Training updates weights between forwards, so this holds only while a FrozenWeights scope is alive on the
// calling thread (the inference runner keeps one around each forward, eager or captured into a CUDA graph).
#pragma once

namespace dscpp::ops {

class FrozenWeights {
 public:
  FrozenWeights();
  ~FrozenWeights();
  FrozenWeights(const FrozenWeights&) = delete;
  FrozenWeights& operator=(const FrozenWeights&) = delete;

 private:
  bool previous_;
};

// True inside a FrozenWeights scope on this thread.
bool weights_frozen();

}  // namespace dscpp::ops
