// KVCache: one allocation for every layer's blocks; the block allocator decides which blocks hold what.
#include "dscpp/inference/kv_cache.h"

#include <algorithm>
#include <string>

namespace dscpp::inference {

KVCache::KVCache(const KVCacheShape& s, DType dtype, Device device) : shape_(s) {
  DSCPP_CHECK(s.n_layer > 0 && s.n_blocks > 0 && s.block_size > 0 && s.n_kv_head > 0 && s.head_dim > 0,
              "KVCache: every dimension must be > 0 (layers ", s.n_layer, ", blocks ", s.n_blocks, ", block size ",
              s.block_size, ", kv heads ", s.n_kv_head, ", head dim ", s.head_dim, ")");
  data_ = Tensor::empty({s.n_layer, s.n_blocks, s.block_size, 2, s.n_kv_head, s.head_dim}, dtype, device);
}

int64_t kv_cache_blocks(const StateManagerConfig& c, int64_t block_size, int64_t bytes_per_block,
                        int64_t free_bytes) {
  DSCPP_CHECK(block_size > 0 && bytes_per_block > 0, "kv_cache_blocks: block size ", block_size,
              " and bytes per block ", bytes_per_block, " must be > 0");
  const KVMemoryConfig& m = c.memory_config;
  int64_t blocks = m.mode == "allocate" ? m.size : std::max<int64_t>(free_bytes - m.size, 0) / bytes_per_block;
  int64_t need = (c.max_context + block_size - 1) / block_size;
  if (blocks < need) {
    std::string how = m.mode == "allocate"
                          ? "state_manager.memory_config.size = " + std::to_string(m.size) + " blocks (mode allocate)"
                          : std::to_string(free_bytes) + " bytes free less state_manager.memory_config.size = " +
                                std::to_string(m.size) + " reserved, at " + std::to_string(bytes_per_block) +
                                " bytes per block";
    DSCPP_FAIL("KV cache: ", how, " gives ", blocks, " blocks of ", block_size, " tokens, fewer than the ", need,
               " one sequence of state_manager.max_context = ", c.max_context, " tokens needs");
  }
  return blocks;
}

}  // namespace dscpp::inference
