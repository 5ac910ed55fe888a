// CudaGraph: a fixed sequence of device work recorded once and replayed with one launch (CUDA graphs), for the
// inference engine's decode steps, where hundreds of small kernels would otherwise each pay a host launch.
//
//   CudaGraph g;
//   g.capture(device, [&] { forward_into(fixed_inputs, fixed_outputs); });   // records, runs nothing
//   ... write new values into fixed_inputs ...
//   g.replay();                                                              // on the current stream
//
// Note [Graph memory]
// A graph replays the same device addresses it saw at capture. Capture therefore runs on one capture stream per
// device, made current for the capture (so the kernels are recorded there and the caching allocator tags what the
// capture allocates with that stream, Note [Current stream]); nothing else ever runs on it. A block the captured
// work allocated and freed goes back to that stream's free list, where only a later capture can take it again:
// every graph's scratch may overlap every other graph's, never eager work's. That is safe because graphs replay
// one after another on one stream and carry nothing from one replay to the next: what a graph must keep (its
// inputs and outputs) the caller allocates before capture and holds.
// Capture uses cudaStreamCaptureModeRelaxed: the allocator may cudaMalloc a new segment mid-capture.
#pragma once
#include <functional>
#include <memory>

namespace dscpp {

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(CudaGraph&&) noexcept;
  CudaGraph& operator=(CudaGraph&&) noexcept;

  // Records the device work `work` enqueues on `device` (throws dscpp::Error naming the failing call; a failed
  // capture leaves the graph empty and the device usable). Throws in a build without CUDA.
  void capture(int device, const std::function<void()>& work);
  void replay() const;  // enqueues the recorded work on the current stream of the capture's device
  bool captured() const;
  int nodes() const;    // kernels and copies recorded

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dscpp
