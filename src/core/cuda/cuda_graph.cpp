// CudaGraph (include/dscpp/core/cuda_graph.h): capture on a per-device capture stream, replay on the current one.
#ifdef DSCPP_WITH_CUDA
#include "dscpp/core/cuda_graph.h"

#include <array>
#include <mutex>

#include "core/cuda/cuda_runtime.cuh"

namespace dscpp {
namespace {

// Note [Graph memory]: one stream per device that only captures ever use.
cudaStream_t capture_stream(int device) {
  static std::mutex mu;
  static std::array<cudaStream_t, 64> streams{};
  DSCPP_CHECK(device >= 0 && device < int(streams.size()), "CudaGraph: device ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!streams[size_t(device)]) {
    cuda::DeviceGuard g(device);
    DSCPP_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(device)], cudaStreamNonBlocking));
  }
  return streams[size_t(device)];
}

}  // namespace

struct CudaGraph::Impl {
  int device = -1;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  ~Impl() {
    if (exec) (void)cudaGraphExecDestroy(exec);  // destructors do not throw
    if (graph) (void)cudaGraphDestroy(graph);
  }
};

CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;

void CudaGraph::capture(int device, const std::function<void()>& work) {
  impl_.reset();
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  cuda::DeviceGuard dg(device);
  const cudaStream_t s = capture_stream(device);
  // The capture stream starts after everything already queued on the current stream (the inputs' uploads).
  cuda::Event ready;
  ready.record(cuda::current_stream(device));
  ready.wait(s);
  {
    cuda::StreamGuard sg(device, s);
    DSCPP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    try {
      work();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(s, &broken);  // ends the capture so the stream is usable again
      if (broken) (void)cudaGraphDestroy(broken);
      (void)cudaGetLastError();
      throw;
    }
    DSCPP_CUDA_CHECK(cudaStreamEndCapture(s, &impl->graph));
  }
  DSCPP_CUDA_CHECK(cudaGraphGetNodes(impl->graph, nullptr, &impl->nodes));
  DSCPP_CUDA_CHECK(cudaGraphInstantiate(&impl->exec, impl->graph, 0));
  impl_ = std::move(impl);
}

void CudaGraph::replay() const {
  DSCPP_CHECK(impl_, "CudaGraph::replay: nothing was captured");
  cuda::DeviceGuard g(impl_->device);
  DSCPP_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::current_stream(impl_->device)));
}

bool CudaGraph::captured() const { return impl_ != nullptr; }
int CudaGraph::nodes() const { return impl_ ? int(impl_->nodes) : 0; }

}  // namespace dscpp
#endif  // DSCPP_WITH_CUDA
