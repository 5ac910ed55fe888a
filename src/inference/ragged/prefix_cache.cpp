#include "inference/ragged/prefix_cache.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp::inference {

PrefixCache::PrefixCache(int32_t n_blocks, int64_t block_size)
    : block_size_(block_size), slot_(size_t(n_blocks)), tokens_(size_t(n_blocks) * size_t(block_size)) {}

static uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every input bit moves every output bit
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t PrefixCache::chain(uint64_t parent, const int32_t* tokens, int64_t block_size) {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
  for (int64_t i = 0; i < block_size; i++) h = mix(h ^ uint64_t(uint32_t(tokens[i])));
  return h;
}

int32_t PrefixCache::lookup(uint64_t key, uint64_t parent, const int32_t* tokens) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  int32_t b = it->second;
  const int32_t* have = tokens_.data() + size_t(b) * size_t(block_size_);
  if (slot_[size_t(b)].parent != parent || !std::equal(tokens, tokens + block_size_, have)) return -1;
  return b;
}

bool PrefixCache::insert(int32_t block, uint64_t key, uint64_t parent, const int32_t* tokens) {
  Slot& s = slot_[size_t(block)];
  DSCPP_CHECK(!s.registered, "prefix cache: block ", block, " is registered already");
  if (!by_key_.emplace(key, block).second) return false;
  s.registered = true;
  s.key = key;
  s.parent = parent;
  std::copy(tokens, tokens + block_size_, tokens_.begin() + ptrdiff_t(size_t(block) * size_t(block_size_)));
  return true;
}

void PrefixCache::park(int32_t block) {
  Slot& s = slot_[size_t(block)];
  DSCPP_CHECK(s.registered && !s.parked, "prefix cache: cannot park block ", block);
  s.parked = true;
  s.lru_pos = lru_.insert(lru_.end(), block);
}

void PrefixCache::unpark(int32_t block) {
  Slot& s = slot_[size_t(block)];
  DSCPP_CHECK(s.parked, "prefix cache: block ", block, " is not parked");
  lru_.erase(s.lru_pos);
  s.parked = false;
}

int32_t PrefixCache::evict() {
  if (lru_.empty()) return -1;
  int32_t b = lru_.front();
  lru_.pop_front();
  Slot& s = slot_[size_t(b)];
  by_key_.erase(s.key);
  s = Slot{};
  return b;
}

void PrefixCache::check() const {
  int64_t n_registered = 0, n_parked = 0;
  for (size_t b = 0; b < slot_.size(); b++) {
    const Slot& s = slot_[b];
    DSCPP_CHECK(!s.parked || s.registered, "prefix cache: block ", b, " is parked but not registered");
    if (!s.registered) continue;
    n_registered++;
    n_parked += s.parked;
    auto it = by_key_.find(s.key);
    DSCPP_CHECK(it != by_key_.end() && it->second == int32_t(b), "prefix cache: block ", b,
                " is registered but its key names another block");
    DSCPP_CHECK(!s.parked || *s.lru_pos == int32_t(b), "prefix cache: block ", b, " has a stale LRU position");
  }
  DSCPP_CHECK(n_registered == int64_t(by_key_.size()), "prefix cache: ", by_key_.size(), " keys for ", n_registered,
              " registered blocks");
  DSCPP_CHECK(n_parked == int64_t(lru_.size()), "prefix cache: ", lru_.size(), " blocks in the LRU for ", n_parked,
              " parked");
}

}  // namespace dscpp::inference
