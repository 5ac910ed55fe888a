// PrefixCache: full KV blocks found by the content of the prefix they complete, so that sequences starting with the
// same tokens share them instead of recomputing (vLLM's automatic prefix caching; FastGen has none).
//
// Note [Prefix cache]
// A block's key is chain(parent, tokens): a hash chained over the sequence's full blocks in order, so one key names
// the block's tokens *and* everything before them; equal keys mean equal KV. The entry also keeps the parent key and
// the tokens, compared on lookup, so a 64-bit collision needs equal tokens under colliding parents. Life of a block:
//   - allocated to one sequence and written by forwards (private, refcount 1, not in the cache);
//   - once full and its forward has run (post-forward), registered here (shareable); a sequence that later starts
//     with the same tokens takes it (the state manager's refcount + 1) and starts its seen tokens after it;
//   - when no sequence holds it (refcount 0) it stays registered and is *parked*: evictable, least recently used
//     first, when the allocator runs short. A parked block that is matched again is unparked.
// Only full blocks are shared and sequences append after their last full block, so nobody writes a shared block.
// A sequence's blocks are released last-first, so a chain's tail is evicted before its head (a head without its
// tail still serves; a tail without its head is unreachable). Refcounts live in the state manager, which owns the
// sequences; this class keeps the table and the LRU order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace dscpp::inference {

class PrefixCache {
 public:
  PrefixCache(int32_t n_blocks, int64_t block_size);

  static constexpr uint64_t kRoot = 0;  // the parent key of a sequence's first block
  // The key of a full block of `block_size` tokens following the prefix whose key is `parent`.
  static uint64_t chain(uint64_t parent, const int32_t* tokens, int64_t block_size);

  // The registered block with this key, parent and tokens, or -1. Does not change the LRU order.
  int32_t lookup(uint64_t key, uint64_t parent, const int32_t* tokens) const;
  // Registers a full, computed block; false (and nothing changes) when the key already names another block, which
  // happens when two sequences computed the same prefix at once: the second copy stays private.
  bool insert(int32_t block, uint64_t key, uint64_t parent, const int32_t* tokens);

  bool registered(int32_t block) const { return slot_[size_t(block)].registered; }
  bool parked(int32_t block) const { return slot_[size_t(block)].parked; }
  void park(int32_t block);    // no sequence holds it any more: most recently used end of the LRU
  void unpark(int32_t block);  // a sequence took it again
  int32_t evict();             // unregisters the least recently used parked block and returns it; -1 when none
  int32_t n_parked() const { return int32_t(lru_.size()); }
  int64_t n_registered() const { return int64_t(by_key_.size()); }
  void check() const;          // table, slots and LRU agree (throws dscpp::Error)

 private:
  struct Slot {
    bool registered = false;
    bool parked = false;
    uint64_t key = 0, parent = 0;
    std::list<int32_t>::iterator lru_pos;  // valid while parked
  };
  int64_t block_size_;
  std::vector<Slot> slot_;
  std::vector<int32_t> tokens_;  // [n_blocks][block_size]: the tokens of each registered block
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::list<int32_t> lru_;       // parked blocks, least recently used first
};

}  // namespace dscpp::inference
