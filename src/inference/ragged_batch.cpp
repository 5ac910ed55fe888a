#include "dscpp/inference/ragged_batch.h"

#include "dscpp/core/check.h"

namespace dscpp::inference {

// Each check names the entry: a batch built wrong must not write into another sequence's KV blocks.
void RaggedBatch::validate(int64_t block_size) const {
  const int64_t S = n_seqs(), N = n_tokens();
  DSCPP_CHECK(S >= 1 && seq_start[0] == 0 && seq_start[size_t(S)] == N,
              "ragged batch: seq_start must run from 0 to the ", N, " tokens over at least one sequence");
  DSCPP_CHECK(positions.size() == tokens.size(), "ragged batch: ", positions.size(), " positions for ", N, " tokens");
  DSCPP_CHECK(seq_seen.size() == size_t(S), "ragged batch: ", seq_seen.size(), " seq_seen entries for ", S,
              " sequences");
  DSCPP_CHECK(max_blocks_per_seq > 0 && block_table.size() == size_t(S * max_blocks_per_seq), "ragged batch: ",
              "block_table has ", block_table.size(), " entries, expected ", S, " sequences x max_blocks_per_seq ",
              max_blocks_per_seq);
  for (int64_t s = 0; s < S; s++) {
    DSCPP_CHECK(n_new(s) >= 1, "ragged batch: sequence ", s, " has no new token");
    for (int64_t i = 0; i < n_new(s); i++) {
      const int64_t n = seq_start[size_t(s)] + i;
      DSCPP_CHECK(positions[size_t(n)] == seq_seen[size_t(s)] + i, "ragged batch: token ", n, " of sequence ", s,
                  " has position ", positions[size_t(n)], ", expected seq_seen + ", i, " = ", seq_seen[size_t(s)] + i);
    }
    const int64_t need = (seq_seen[size_t(s)] + n_new(s) + block_size - 1) / block_size;
    DSCPP_CHECK(need <= max_blocks_per_seq, "ragged batch: sequence ", s, " needs ", need, " blocks of ", block_size,
                ", the block table holds ", max_blocks_per_seq);
    for (int64_t j = 0; j < need; j++)
      DSCPP_CHECK(block_table[size_t(s * max_blocks_per_seq + j)] >= 0, "ragged batch: sequence ", s, " has no block ",
                  j, " for its positions [", j * block_size, ", ", (j + 1) * block_size, ")");
  }
}

}  // namespace dscpp::inference
