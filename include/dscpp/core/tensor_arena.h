// TensorArena: slices of one flat buffer handed out first-fit and given back explicitly.
//
// For memory that cannot come from the caching allocator one tensor at a time, such as NCCL's symmetric windows
// (registering one is a collective): ZeRO's copy-engine gathers and reductions take their windows from an arena
// over one registered buffer (Note [Copy-engine ZeRO], runtime/zero_params.h).
// - Deterministic: the same sequence of take/give_back calls gives the same slices, so ranks that run the same
//   program agree, without talking, on which ops found room.
// - No stream tracking: a slice given back may be handed out again at once. Whoever gives one back must make sure
//   that later work on the reusing stream is ordered after every use of the old one, as the caching allocator's
//   same-stream rule does (runtime users give back only after the compute stream has waited for the collective).
#pragma once
#include <cstdint>
#include <map>

#include "dscpp/core/tensor.h"

namespace dscpp {

class TensorArena {
 public:
  TensorArena() = default;
  explicit TensorArena(Tensor buffer);  // a 1-D tensor (views are contiguous); its dtype is the slices' dtype

  bool defined() const { return buffer_.defined(); }
  // A slice of n elements (offsets aligned to 256 bytes), or an undefined tensor when no free range is large enough.
  Tensor take(int64_t n);
  void give_back(const Tensor& slice);  // a slice from take(), given back once
  bool holds(const Tensor& t) const;    // t lies inside the buffer

  int64_t capacity() const { return buffer_.defined() ? buffer_.numel() : 0; }
  int64_t nbytes() const { return buffer_.defined() ? buffer_.nbytes() : 0; }
  int64_t used() const { return used_; }
  int64_t peak_used() const { return peak_used_; }
  const Tensor& buffer() const { return buffer_; }

 private:
  int64_t rounded(int64_t n) const;
  Tensor buffer_;
  int64_t align_ = 1;                  // elements per 256 bytes
  std::map<int64_t, int64_t> free_;    // offset -> elements, coalesced
  std::map<int64_t, int64_t> taken_;   // offset -> elements (rounded)
  int64_t used_ = 0, peak_used_ = 0;
};

}  // namespace dscpp
