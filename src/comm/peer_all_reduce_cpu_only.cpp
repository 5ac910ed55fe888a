// PeerAllReduce in a build without CUDA: never available (create says why); the CUDA build's is
// src/comm/cuda/peer_all_reduce.cu.
#ifndef DSCPP_WITH_CUDA
#include "dscpp/comm/peer_all_reduce.h"

#include "dscpp/core/check.h"

namespace dscpp {

struct PeerAllReduce::Impl {};

PeerAllReduce::PeerAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerAllReduce::~PeerAllReduce() = default;

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(ProcessGroup&, int64_t, std::string* why) {
  if (why) *why = "this build has no CUDA backend";
  return nullptr;
}

bool PeerAllReduce::fits(const Tensor&) const { return false; }
void PeerAllReduce::all_reduce(Tensor&) { DSCPP_FAIL("PeerAllReduce: this build has no CUDA backend"); }
int64_t PeerAllReduce::max_bytes() const { return 0; }

}  // namespace dscpp
#endif
