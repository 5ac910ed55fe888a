// The CUDA queries of dscpp/core/cuda.h in a build without the CUDA backend: no devices.
#ifndef DSCPP_WITH_CUDA
#include "dscpp/core/cuda.h"
#include "dscpp/core/cuda_graph.h"
#include "dscpp/core/device_memory.h"

#include "dscpp/core/check.h"
#include "dscpp/core/tensor.h"

namespace dscpp {

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }

void cuda_set_device(int device) {
  DSCPP_FAIL("cuda_set_device(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

void cuda_synchronize(int device) {
  DSCPP_FAIL("cuda_synchronize(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}
void cuda_stream_synchronize(int device) {
  DSCPP_FAIL("cuda_stream_synchronize(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

int cuda_current_stream_urgency(int device) {
  DSCPP_FAIL("cuda_current_stream_urgency(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

std::string cuda_device_name(int device) {
  DSCPP_FAIL("cuda_device_name(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

std::string cuda_device_pci_id(int) { return ""; }

int64_t cuda_device_memory(int device) {
  DSCPP_FAIL("cuda_device_memory(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

int64_t cuda_device_free_memory(int device) {
  DSCPP_FAIL("cuda_device_free_memory(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

int64_t cuda_workspace_pool_bytes(int device) {
  DSCPP_FAIL("cuda_workspace_pool_bytes(", device, "): this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}

void set_cuda_error_backtrace(bool) {}

Allocator& pinned_host_allocator() { return cpu_allocator(); }

void copy_async(const Tensor& dst, const Tensor& src) {
  DSCPP_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "copy_async from ", src.str(), " to ", dst.str(),
              ": this build has no CUDA backend");
  Tensor d = dst;
  d.copy_from(src);
}

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;
void CudaGraph::capture(int device, const std::function<void()>&) {
  DSCPP_FAIL("CudaGraph::capture on cuda:", device, ": this build has no CUDA backend (configure with -DDSCPP_CUDA=ON)");
}
void CudaGraph::replay() const { DSCPP_FAIL("CudaGraph::replay: this build has no CUDA backend"); }
bool CudaGraph::captured() const { return false; }
int CudaGraph::nodes() const { return 0; }

}  // namespace dscpp
#endif  // !DSCPP_WITH_CUDA
