// DeepSpeed's partition methods (runtime/pipe/partition.h) against the results DeepSpeed documents and tests
// (deepspeed/runtime/utils.py, tests/unit/utils/test_partition_balanced.py).
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/pipe/partition.h"

namespace dscpp {
namespace {

using V = std::vector<int64_t>;

TEST(PipePartition, UniformGivesTheFirstPartsTheRemainder) {
  EXPECT_EQ(partition_uniform(10, 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(8, 4), (V{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(6, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_uniform(3, 5), (V{0, 1, 2, 3, 3, 3}));  // fewer items than parts: trailing parts empty
}

int64_t spread(const V& w, const V& parts) {
  int64_t hi = 0, lo = INT64_MAX;
  for (size_t i = 0; i + 1 < parts.size(); i++) {
    int64_t s = 0;
    for (int64_t j = parts[i]; j < parts[i + 1]; j++) s += w[size_t(j)];
    hi = std::max(hi, s), lo = std::min(lo, s);
  }
  return hi - lo;
}

TEST(PipePartition, BalancedMatchesDeepSpeedsTests) {
  // DeepSpeed's check_partition: the spread (max - min part sum) of its results.
  EXPECT_EQ(spread({1, 2, 1}, partition_balanced({1, 2, 1}, 4)), 2);  // n <= k: uniform, one part empty
  EXPECT_EQ(partition_balanced({1, 1, 1, 1}, 4), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(spread({1, 1, 1, 1, 1}, partition_balanced({1, 1, 1, 1, 1}, 4)), 1);
  EXPECT_EQ(spread({1, 1, 1, 1, 0, 1}, partition_balanced({1, 1, 1, 1, 0, 1}, 4)), 1);
  // The cuts themselves, worked by hand through the recurrence (ties to the later cut).
  EXPECT_EQ(partition_balanced({1, 1, 1, 1, 1}, 4), (V{0, 2, 3, 4, 5}));
  EXPECT_EQ(partition_balanced({1, 1, 1, 1, 0, 1}, 4), (V{0, 2, 3, 5, 6}));
  EXPECT_EQ(partition_balanced({3, 4, 5}, 2), (V{0, 2, 3}));
  // A transformer: a heavy embedding, equal blocks, a light head.
  EXPECT_EQ(partition_balanced({40, 10, 10, 10, 10, 10, 10, 1}, 2), (V{0, 2, 8}));
}

TEST(PipePartition, BalancedPartsAreNonEmptyAndCoverEveryItem) {
  uint64_t x = 12345;
  for (int trial = 0; trial < 200; trial++) {
    V w;
    const int n = 2 + int((x >> 20) % 8);
    for (int i = 0; i < n; i++) w.push_back(int64_t((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 58));
    const int64_t k = 1 + int64_t(x >> 61) % std::min<int64_t>(n, 4);
    const V got = partition_balanced(w, k);
    ASSERT_EQ(got.size(), size_t(k + 1));
    EXPECT_EQ(got.front(), 0);
    EXPECT_EQ(got.back(), n);
    for (size_t i = 0; i + 1 < got.size(); i++) EXPECT_LT(got[i], got[i + 1]) << "an empty part, trial " << trial;
  }
}

TEST(PipePartition, MethodNamesTheKey) {
  EXPECT_EQ(partition_layers("uniform", {5, 1, 1, 1}, 2), (V{0, 2, 4}));
  EXPECT_EQ(partition_layers("parameters", {5, 1, 1, 1}, 2), (V{0, 1, 4}));
  try {
    partition_layers("type:transformer", {1, 1}, 2);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.partition_method"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dscpp
