// How much memory a device can still hand out: what sizes buffers made to fill the device (the inference engine's
// KV cache, Note [KV cache size]).
#pragma once
#include <cstdint>

namespace dscpp {

// Bytes of the CUDA device's memory no allocation holds (cudaMemGetInfo) plus what our caching allocator holds
// unused. Throws in a CPU-only build.
int64_t cuda_device_free_memory(int device);

}  // namespace dscpp
