// Test doubles for the inference engine's host side. ShadowKV stands in for the KV cache with one token id per slot:
// writing a batch stores each new token at its block and slot, so reading a sequence back through its block list
// shows whether the block tables (sharing, eviction, reuse) kept every sequence's context intact. FakeModel is a
// TokenModel over it whose next token depends on the whole context it reads back, so any lost or misplaced token
// changes the stream.
#pragma once
#include <cstdint>
#include <vector>

#include "dscpp/core/check.h"
#include "dscpp/inference/ragged_batch.h"
#include "dscpp/inference/token_model.h"

namespace dscpp::inference::testing {

struct ShadowKV {
  int64_t block_size;
  std::vector<int32_t> slots;  // [n_blocks][block_size], -1 = never written
  ShadowKV(int64_t n_blocks, int64_t bs) : block_size(bs), slots(size_t(n_blocks * bs), -1) {}

  void write(const RaggedBatch& b) {
    for (int64_t s = 0; s < b.n_seqs(); s++)
      for (int64_t t = b.seq_start[s]; t < b.seq_start[s + 1]; t++) {
        int64_t p = b.positions[t];
        int32_t block = b.block_table[s * b.max_blocks_per_seq + p / block_size];
        slots[size_t(block * block_size + p % block_size)] = b.tokens[t];
      }
  }
  // Positions [0, n) of a sequence whose blocks are blocks[0..].
  std::vector<int32_t> read(const int32_t* blocks, int64_t n) const {
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; p++) out[size_t(p)] = slots[size_t(blocks[p / block_size] * block_size + p % block_size)];
    return out;
  }
};

// The "model": a hash of the whole context, folded into [1, vocab).
inline int32_t next_token_of(const std::vector<int32_t>& context, int32_t vocab = 1000) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint64_t(uint32_t(t))) * 1099511628211ull;
  h ^= h >> 29;
  return int32_t(1 + h % uint64_t(vocab - 1));
}

// What generation without any engine gives: the reference stream.
inline std::vector<int32_t> reference_stream(std::vector<int32_t> context, int64_t max_new,
                                             const std::vector<int32_t>& stop = {}) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < max_new; i++) {
    int32_t t = next_token_of(context);
    out.push_back(t);
    context.push_back(t);
    for (int32_t s : stop)
      if (s == t) return out;
  }
  return out;
}

struct FakeModel : TokenModel {
  ShadowKV kv;
  std::vector<std::vector<uint8_t>> wants_log;  // per call
  std::vector<int64_t> tokens_log;              // tokens per call
  FakeModel(int64_t n_blocks, int64_t bs) : kv(n_blocks, bs) {}

  std::vector<int32_t> next_tokens(const RaggedBatch& b, const std::vector<int64_t>& uids,
                                   const std::vector<uint8_t>& wants) override {
    b.validate(kv.block_size);
    DSCPP_CHECK(int64_t(uids.size()) == b.n_seqs() && wants.size() == uids.size(), "FakeModel: bad call");
    kv.write(b);
    wants_log.push_back(wants);
    tokens_log.push_back(b.n_tokens());
    std::vector<int32_t> out(uids.size(), -1);
    for (int64_t s = 0; s < b.n_seqs(); s++)
      if (wants[size_t(s)])
        out[size_t(s)] = next_token_of(kv.read(&b.block_table[size_t(s * b.max_blocks_per_seq)],
                                               b.seq_seen[s] + b.n_new(s)));
    return out;
  }
};

}  // namespace dscpp::inference::testing
