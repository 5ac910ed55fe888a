// The blocked (paged) KV cache: one tensor per engine, [layers][blocks][block_size][2 (K, V)][kv_heads][head_dim]
// (DeepSpeed-FastGen's layout with one allocation group). A sequence owns a list of blocks (RaggedBatch::block_table),
// not a contiguous range, so sequences grow and free without fragmentation; which blocks are free is the block
// allocator's business (ragged/block_allocator.h), what they hold is the forward's.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/inference/inference_config.h"

namespace dscpp::inference {

struct KVCacheShape {
  int64_t n_layer = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 64;   // tokens per block (dscpp.kv_block_size)
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;

  int64_t elements_per_block() const { return block_size * 2 * n_kv_head * head_dim; }  // one layer
  int64_t bytes_per_block(DType dt) const { return n_layer * elements_per_block() * dtype_size(dt); }  // all layers
};

class KVCache {
 public:
  KVCache(const KVCacheShape& shape, DType dtype, Device device);  // contents undefined until written
  const KVCacheShape& shape() const { return shape_; }
  Tensor& data() { return data_; }  // [n_layer, n_blocks, block_size, 2, n_kv_head, head_dim]
  const Tensor& data() const { return data_; }
  // Element offset of (layer, block, slot, k_or_v, head 0, dim 0) in data().
  int64_t offset(int64_t layer, int64_t block, int64_t slot, int64_t kv) const {
    return (((layer * shape_.n_blocks + block) * shape_.block_size + slot) * 2 + kv) * shape_.n_kv_head *
           shape_.head_dim;
  }

 private:
  KVCacheShape shape_;
  Tensor data_;
};

// How many blocks the cache gets, by FastGen's rule: "reserve" takes (free_bytes - size) / bytes_per_block (free_bytes:
// device memory free after the weights and workspace), "allocate" takes `size` blocks. Throws dscpp::Error with the
// numbers when that is fewer than one max_context sequence needs, so start-up refuses instead of a later CUDA OOM.
int64_t kv_cache_blocks(const StateManagerConfig& config, int64_t block_size, int64_t bytes_per_block,
                        int64_t free_bytes);

}  // namespace dscpp::inference
