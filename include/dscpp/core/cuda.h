// CUDA device queries, usable from every build: in a CPU-only build (or on a machine without a GPU)
// cuda_available() is false, cuda_device_count() is 0 and the calls that need a device throw dscpp::Error.
// No CUDA types here: streams and error checks live in the private src/core/cuda/cuda_runtime.cuh.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/core/allocator.h"

namespace dscpp {

class Tensor;

bool cuda_available();                      // built with CUDA and at least one device present; never throws
int cuda_device_count();                    // 0 without CUDA or without a device; never throws
void cuda_set_device(int device);           // this thread's current device; throws without CUDA or if out of range
void cuda_synchronize(int device = -1);     // wait for all work on `device` (-1: the current device)
void cuda_stream_synchronize(int device = -1);  // wait for the work on this thread's current stream of `device` only
// How urgent this thread's current stream on `device` is: 0 normal, more is more urgent (Note [Stream priorities]).
int cuda_current_stream_urgency(int device = -1);
std::string cuda_device_name(int device);   // "NVIDIA H100 80GB HBM3"
// The device's PCI function as sysfs names it ("0000:1b:00.0"); "" when unknown. Never throws.
std::string cuda_device_pci_id(int device);
int64_t cuda_device_memory(int device);     // total bytes of the device's memory
// Bytes the device's memory pool holds for kernels' cudaMallocAsync workspaces (Note [Workspace pool]).
int64_t cuda_workspace_pool_bytes(int device);
// true: a CUDA error's message also carries the thread and the call stack that met it (a debugging aid; off by
// default). Never throws; a no-op in a CPU-only build.
void set_cuda_error_backtrace(bool on);

// Page-locked host memory (cudaHostAlloc) with statistics, for asynchronous copies and checkpoint snapshots.
// Tensors from it are Device::cpu(). A freed block is reused only after the work queued on the current stream
// at the time of the free has finished. In a CPU-only build this is cpu_allocator().
Allocator& pinned_host_allocator();
Tensor empty_pinned(const std::vector<int64_t>& shape, DType dtype);  // a Device::cpu() tensor in pinned memory

// Enqueue a copy (with dtype conversion) on the current stream of the device tensor's device and return without
// waiting: the caller synchronises (cuda_synchronize or a stream event) before reading a host destination or
// reusing a host source. Tensor::copy_from is the synchronous version. Throws in a CPU-only build for device tensors.
void copy_async(const Tensor& dst, const Tensor& src);

}  // namespace dscpp
