// Private: the CUDA allocators behind allocator_for(Device::cuda(i)) and pinned_host_allocator().
// No CUDA types, so src/core/allocator.cpp can include it in any build.
#pragma once
#include "dscpp/core/allocator.h"

namespace dscpp::cuda {

// The caching allocator of `device` (created on first use, lives for the process).
// Throws dscpp::Error when there is no such device.
Allocator& caching_allocator(int device);

}  // namespace dscpp::cuda
