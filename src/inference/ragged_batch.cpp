// RaggedBatch::validate: the invariants the ragged forward relies on, checked on the host (tests, debug builds).
#include "dscpp/inference/ragged_batch.h"

#include <unordered_set>

#include "dscpp/core/check.h"

namespace dscpp::inference {

void RaggedBatch::validate(int64_t block_size) const {
  DSCPP_CHECK(block_size > 0, "RaggedBatch: block_size ", block_size, " must be > 0");
  DSCPP_CHECK(positions.size() == tokens.size(), "RaggedBatch: ", tokens.size(), " tokens but ", positions.size(),
              " positions");
  DSCPP_CHECK(!seq_start.empty() && seq_start[0] == 0, "RaggedBatch: seq_start must begin with 0");
  DSCPP_CHECK(seq_start.back() == n_tokens(), "RaggedBatch: seq_start ends at ", seq_start.back(), " but there are ",
              n_tokens(), " tokens");
  int64_t S = n_seqs();
  DSCPP_CHECK(int64_t(seq_seen.size()) == S, "RaggedBatch: ", seq_seen.size(), " seq_seen for ", S, " sequences");
  DSCPP_CHECK(int64_t(block_table.size()) == S * max_blocks_per_seq, "RaggedBatch: block_table has ",
              block_table.size(), " entries, expected ", S, " sequences x ", max_blocks_per_seq);
  // A block this forward writes belongs to that sequence alone: sharing (prefix caching) is only of full blocks
  // written by an earlier forward, and nobody appends into them.
  std::unordered_set<int32_t> written;
  for (int64_t s = 0; s < S; s++) {
    DSCPP_CHECK(n_new(s) >= 1, "RaggedBatch: sequence ", s, " brings ", n_new(s), " tokens (at least 1)");
    DSCPP_CHECK(seq_seen[s] >= 0, "RaggedBatch: sequence ", s, " has seen ", seq_seen[s], " tokens");
    for (int64_t i = 0; i < n_new(s); i++)
      DSCPP_CHECK(positions[seq_start[s] + i] == seq_seen[s] + i, "RaggedBatch: sequence ", s, " token ", i,
                  " at position ", positions[seq_start[s] + i], ", expected ", seq_seen[s] + i);
    int64_t total = seq_seen[s] + n_new(s);
    int64_t need = (total + block_size - 1) / block_size;
    DSCPP_CHECK(need <= max_blocks_per_seq, "RaggedBatch: sequence ", s, " holds ", total, " tokens = ", need,
                " blocks of ", block_size, ", more than max_blocks_per_seq ", max_blocks_per_seq);
    const int32_t* row = block_table.data() + s * max_blocks_per_seq;
    std::unordered_set<int32_t> own;
    for (int64_t j = 0; j < max_blocks_per_seq; j++) {
      if (j >= need) {
        DSCPP_CHECK(row[j] == -1, "RaggedBatch: sequence ", s, " block_table[", j, "] = ", row[j],
                    " beyond its ", need, " blocks (expected -1)");
        continue;
      }
      DSCPP_CHECK(row[j] >= 0, "RaggedBatch: sequence ", s, " block_table[", j, "] = ", row[j], " (no block)");
      DSCPP_CHECK(own.insert(row[j]).second, "RaggedBatch: sequence ", s, " lists block ", row[j], " twice");
    }
    for (int64_t j = seq_seen[s] / block_size; j < need; j++)
      DSCPP_CHECK(written.insert(row[j]).second, "RaggedBatch: block ", row[j], " is written by two sequences");
  }
  // A block some sequence only reads must not be written by another in the same forward.
  for (int64_t s = 0; s < S; s++)
    for (int64_t j = 0; j < seq_seen[s] / block_size; j++) {
      int32_t b = block_table[s * max_blocks_per_seq + j];
      DSCPP_CHECK(!written.count(b), "RaggedBatch: block ", b, " is read by sequence ", s,
                  " and written by another in the same forward");
    }
}

}  // namespace dscpp::inference
