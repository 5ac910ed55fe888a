// First-fit slices of one buffer (core/tensor_arena.h).
#include "dscpp/core/tensor_arena.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp {

TensorArena::TensorArena(Tensor buffer) : buffer_(std::move(buffer)) {
  DSCPP_CHECK(buffer_.defined() && buffer_.dim() == 1 && buffer_.numel() > 0,
              "TensorArena: needs a non-empty 1-D buffer, got ", buffer_.str());
  align_ = std::max<int64_t>(1, 256 / int64_t(dtype_size(buffer_.dtype())));
  free_[0] = buffer_.numel();
}

int64_t TensorArena::rounded(int64_t n) const { return (n + align_ - 1) / align_ * align_; }

Tensor TensorArena::take(int64_t n) {
  DSCPP_CHECK(n >= 1, "TensorArena::take: ", n, " elements (expected >= 1)");
  if (!buffer_.defined()) return Tensor();
  const int64_t want = rounded(n);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const int64_t off = it->first, len = it->second;
    if (len < n) continue;
    const int64_t take = std::min(want, len);  // the buffer's last range may be shorter than the rounding
    free_.erase(it);
    if (len > take) free_[off + take] = len - take;
    taken_[off] = take;
    used_ += take;
    peak_used_ = std::max(peak_used_, used_);
    return buffer_.slice(off, n);
  }
  return Tensor();
}

bool TensorArena::holds(const Tensor& t) const {
  if (!buffer_.defined() || !t.defined()) return false;
  const char* p = static_cast<const char*>(t.raw());
  const char* base = static_cast<const char*>(buffer_.raw());
  return p >= base && p + t.nbytes() <= base + buffer_.nbytes();
}

void TensorArena::give_back(const Tensor& slice) {
  DSCPP_CHECK(holds(slice), "TensorArena::give_back: ", slice.str(), " is not a slice of this arena");
  const int64_t off = (static_cast<const char*>(slice.raw()) - static_cast<const char*>(buffer_.raw())) /
                      int64_t(dtype_size(buffer_.dtype()));
  auto it = taken_.find(off);
  DSCPP_CHECK(it != taken_.end(), "TensorArena::give_back: no slice taken at element ", off, " (given back twice?)");
  int64_t begin = off, len = it->second;
  taken_.erase(it);
  used_ -= len;
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[begin] = len;
}

}  // namespace dscpp
