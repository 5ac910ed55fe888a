// DeepSpeed's pipeline partition methods (partition.h).
#include "runtime/pipe/partition.h"

#include <limits>

#include "dscpp/core/check.h"

namespace dscpp {

std::vector<int64_t> partition_uniform(int64_t n, int64_t k) {
  DSCPP_CHECK(n >= 0 && k >= 1, "partition_uniform: ", n, " items into ", k, " parts");
  std::vector<int64_t> parts(size_t(k + 1), 0);
  for (int64_t i = 1; i <= k; i++) parts[size_t(i)] = n <= k ? std::min(i, n) : i * (n / k) + std::min(i, n % k);
  return parts;
}

std::vector<int64_t> partition_balanced(const std::vector<int64_t>& weights, int64_t k) {
  const int64_t n = int64_t(weights.size());
  DSCPP_CHECK(k >= 1, "partition_balanced: ", k, " parts");
  if (n <= k) return partition_uniform(n, k);
  std::vector<double> prefix(size_t(n + 1), 0.0);
  for (int64_t i = 0; i < n; i++) prefix[size_t(i + 1)] = prefix[size_t(i)] + double(weights[size_t(i)]);
  // best[i][j]: the first i items in j parts with the least (max - min) part sum; its max, min and last cut.
  struct Cell {
    double cost = std::numeric_limits<double>::infinity(), max = cost, min = cost;
    int64_t cut = 0;
  };
  std::vector<std::vector<Cell>> best(size_t(n + 1), std::vector<Cell>(size_t(k + 1)));
  best[0][0].cost = best[0][0].max = 0.0;  // min stays +inf: no part yet
  for (int64_t i = 1; i <= n; i++)
    for (int64_t j = 1; j <= std::min(i, k); j++) {
      Cell& c = best[size_t(i)][size_t(j)];
      for (int64_t cut = j - 1; cut < i; cut++) {  // the last part is items [cut, i)
        const Cell& prev = best[size_t(cut)][size_t(j - 1)];
        if (prev.cost == std::numeric_limits<double>::infinity()) continue;
        const double part = prefix[size_t(i)] - prefix[size_t(cut)];
        const double hi = std::max(prev.max, part), lo = std::min(prev.min, part);
        if (hi - lo <= c.cost) c = {hi - lo, hi, lo, cut};  // <=: the later cut wins a tie
      }
    }
  std::vector<int64_t> parts(size_t(k + 1));
  parts[size_t(k)] = n;
  for (int64_t j = k; j >= 1; j--) parts[size_t(j - 1)] = best[size_t(parts[size_t(j)])][size_t(j)].cut;
  return parts;
}

std::vector<int64_t> partition_layers(const std::string& method, const std::vector<int64_t>& weights,
                                      int64_t num_parts) {
  if (method == "parameters") return partition_balanced(weights, num_parts);
  if (method == "uniform") return partition_uniform(int64_t(weights.size()), num_parts);
  DSCPP_FAIL("pipeline.partition_method: '", method, "' is not supported (expected \"parameters\" or \"uniform\")");
}

}  // namespace dscpp
