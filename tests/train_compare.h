// Comparing training results (parameters, losses, gradient norms) across runs that should agree: the distributed
// tests (data parallel, ZeRO on Gloo and NCCL) against their one-process references.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dscpp::test_fixtures {

// Worst |a - b| / (|b| + 1e-3 max|b|), with its element, so a failure says where and how far; non-finite fails.
inline void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (float v : b) scale = std::max(scale, double(std::fabs(v)));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); i++) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << ": element " << i << " is " << a[i];
    double err = std::fabs(double(a[i]) - double(b[i])) / (std::fabs(double(b[i])) + 1e-3 * scale);
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst relative error " << worst << " (" << worst / tol
                        << " of the tolerance " << tol << ") at element " << at << ": " << a[at] << " vs " << b[at];
}

}  // namespace dscpp::test_fixtures
