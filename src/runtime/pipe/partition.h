// DeepSpeed's pipeline partition methods (PipelineModule's partition_method): where each stage's layers begin.
// A partition of n items into k parts is the k + 1 boundaries parts[0] = 0 <= ... <= parts[k] = n; part i holds the
// items [parts[i], parts[i + 1]).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

// "uniform": as many items per part as can be, the first n % k parts one more; with n <= k, one item per part and
// the last k - n parts empty (deepspeed.runtime.utils.partition_uniform).
std::vector<int64_t> partition_uniform(int64_t num_items, int64_t num_parts);

// "parameters" (deepspeed.runtime.utils.partition_balanced): contiguous non-empty parts whose weight sums differ
// little (max - min), by dynamic programming over the prefix sums: for i items in j parts it keeps the one split of
// least spread, extending it by the last part [cut, i), ties going to the later cut. Keeping one split per state
// makes it a heuristic (not always the least spread), but DeepSpeed's stage boundaries are its results; with n <= k,
// as partition_uniform.
std::vector<int64_t> partition_balanced(const std::vector<int64_t>& weights, int64_t num_parts);

// The boundaries for pipeline.partition_method ("parameters" or "uniform", the config's words) over layers of these
// weights (parameter counts, in pipeline order).
std::vector<int64_t> partition_layers(const std::string& method, const std::vector<int64_t>& weights,
                                      int64_t num_parts);

}  // namespace dscpp
