// BlockAllocator: which KV-cache blocks are free. A free list over n blocks (FastGen's BlockedAllocator), checked:
// allocate(n) takes all n or none, and free() refuses a block out of range or already free before freeing any.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dscpp::inference {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t n_blocks);

  // n blocks, lowest ids first from a fresh allocator; throws dscpp::Error naming n and the free count when fewer
  // are free (nothing is taken then).
  std::vector<int32_t> allocate(int32_t n);
  // Returns the blocks; throws dscpp::Error (and frees none) for an id out of [0, n_blocks), a block already free,
  // or one listed twice.
  void free(const std::vector<int32_t>& blocks);

  bool is_free(int32_t block) const { return is_free_[size_t(block)] != 0; }
  int32_t n_blocks() const { return int32_t(is_free_.size()); }
  int32_t n_free() const { return int32_t(free_list_.size()); }
  int32_t n_used() const { return n_blocks() - n_free(); }

 private:
  std::vector<int32_t> free_list_;  // a stack: the block freed last is reused first (still warm in L2)
  std::vector<uint8_t> is_free_;    // per block, for the double-free check
};

}  // namespace dscpp::inference
