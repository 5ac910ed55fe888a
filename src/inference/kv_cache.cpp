// KVCache: one allocation for every layer's blocks; the block allocator decides which blocks hold what.
#include "dscpp/inference/kv_cache.h"

namespace dscpp::inference {

KVCache::KVCache(const KVCacheShape& s, DType dtype, Device device) : shape_(s) {
  DSCPP_CHECK(s.n_layer > 0 && s.n_blocks > 0 && s.block_size > 0 && s.n_kv_head > 0 && s.head_dim > 0,
              "KVCache: every dimension must be > 0 (layers ", s.n_layer, ", blocks ", s.n_blocks, ", block size ",
              s.block_size, ", kv heads ", s.n_kv_head, ", head dim ", s.head_dim, ")");
  data_ = Tensor::empty({s.n_layer, s.n_blocks, s.block_size, 2, s.n_kv_head, s.head_dim}, dtype, device);
}

}  // namespace dscpp::inference
