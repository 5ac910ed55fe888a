// PeerAllReduce: a sum all-reduce for the small messages of tensor-parallel decode (a few KiB to a MiB per layer),
// over CUDA peer memory. NCCL's all-reduce of 8 KiB costs tens of microseconds end to end, most of it protocol, and
// a decode step of an 8B model on 2 GPUs makes 64 of them; here every rank's buffer is mapped into every other
// rank's address space (CUDA IPC), and one kernel copies the input into its own buffer, meets the same block of
// every other rank at a flag barrier, and reads the peers' buffers directly (the design of vLLM's and
// TensorRT-LLM's custom all-reduces; Note [Peer all-reduce] in src/comm/cuda/peer_all_reduce.cu).
//
//   auto ar = PeerAllReduce::create(group, 1 << 20);   // a collective; null on every rank if any cannot
//   if (ar && ar->fits(x)) ar->all_reduce(x); else group.all_reduce_on_stream(x);
//
// One-shot (every rank sums all buffers) on 2 ranks and for small messages; two-shot (reduce-scatter, then gather
// the reduced chunks) from 256 KiB on more ranks. The sum runs in f32 in rank order, so every rank gets the same
// bits. It runs on the current stream with no host work, so a CUDA graph may capture it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/core/tensor.h"

namespace dscpp {

class ProcessGroup;

class PeerAllReduce {
 public:
  // A collective over `group` (its ranks' GPUs, one per rank, on one node): buffers of max_bytes per rank, mapped
  // everywhere through CUDA IPC handles exchanged over the group's store. Null on every rank, with *why, when any
  // rank cannot take part (a CPU or one-rank group, a rank count other than 2, 4 or 8, GPUs without peer access, a
  // build without CUDA).
  static std::unique_ptr<PeerAllReduce> create(ProcessGroup& group, int64_t max_bytes, std::string* why = nullptr);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // t is f32, bf16 or f16 on this rank's GPU, of at most max_bytes, in whole 16-byte vectors.
  bool fits(const Tensor& t) const;
  // t (=) the sum over the ranks of t, on the current stream. Every rank calls it with the same size, in the same
  // order as its other calls. If the job aborts (the store's abort key), a kernel waiting for a dead peer gives up
  // and the result is garbage: the group's failure is reported by its next op.
  void all_reduce(Tensor& t);
  int64_t max_bytes() const;

 private:
  struct Impl;
  explicit PeerAllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dscpp
