#include "inference/ragged/block_allocator.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp::inference {

BlockAllocator::BlockAllocator(int32_t n_blocks) : is_free_(size_t(n_blocks > 0 ? n_blocks : 0), 1) {
  DSCPP_CHECK(n_blocks > 0, "BlockAllocator: the KV cache must have at least one block (got ", n_blocks, ")");
  free_list_.reserve(size_t(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; b--) free_list_.push_back(b);  // pops 0, 1, 2, ...
}

std::vector<int32_t> BlockAllocator::allocate(int32_t n) {
  DSCPP_CHECK(n >= 0, "BlockAllocator: cannot allocate ", n, " blocks");
  if (n > n_free())
    DSCPP_FAIL("KV cache: cannot allocate ", n, " blocks, only ", n_free(), " of ", n_blocks(), " are free");
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  std::reverse(out.begin(), out.end());
  free_list_.resize(free_list_.size() - size_t(n));
  for (int32_t b : out) is_free_[size_t(b)] = 0;
  return out;
}

void BlockAllocator::free(const std::vector<int32_t>& blocks) {
  // Check every block first, so a bad list changes nothing. A block seen earlier in the list is marked 2 meanwhile.
  auto unmark = [&](size_t upto) {
    for (size_t k = 0; k < upto; k++) is_free_[size_t(blocks[k])] = 0;
  };
  for (size_t i = 0; i < blocks.size(); i++) {
    int32_t b = blocks[i];
    if (b < 0 || b >= n_blocks()) {
      unmark(i);
      DSCPP_FAIL("KV cache: cannot free block ", b, ": out of range [0, ", n_blocks(), ")");
    }
    if (is_free_[size_t(b)] != 0) {
      bool twice = is_free_[size_t(b)] == 2;
      unmark(i);
      DSCPP_FAIL("KV cache: double free of block ", b, twice ? " (listed twice)" : " (it is already free)");
    }
    is_free_[size_t(b)] = 2;
  }
  for (int32_t b : blocks) {
    is_free_[size_t(b)] = 1;
    free_list_.push_back(b);
  }
}

}  // namespace dscpp::inference
