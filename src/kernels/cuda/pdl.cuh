// Private: programmatic dependent launch (Note [Frozen weights], frozen_weights.h) on the device side. Both are
// no-ops for a kernel launched without the PDL attribute, and compile to nothing before sm_90.
#pragma once

namespace dscpp::cuda {

// Lets the next kernel in the stream, if launched as a programmatic dependent, start while this one runs.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the kernels ahead of this one have finished and their writes are visible.
__device__ __forceinline__ void wait_for_dependencies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace dscpp::cuda
