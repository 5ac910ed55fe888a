#include "dscpp/inference/kv_cache.h"

#include "dscpp/core/check.h"

namespace dscpp::inference {

KVCache::KVCache(const KVCacheShape& shape, DType dtype, Device device) : shape_(shape) {
  DSCPP_CHECK(shape.n_layer > 0 && shape.n_blocks > 0 && shape.block_size > 0 && shape.n_kv_head > 0 &&
                  shape.head_dim > 0,
              "KV cache: every dimension must be positive, got ", shape.n_layer, " layers, ", shape.n_blocks,
              " blocks of ", shape.block_size, ", ", shape.n_kv_head, " kv heads of ", shape.head_dim);
  data_ = Tensor::empty({shape.n_layer, shape.n_blocks, shape.block_size, 2, shape.n_kv_head, shape.head_dim}, dtype,
                        device);
}

}  // namespace dscpp::inference
