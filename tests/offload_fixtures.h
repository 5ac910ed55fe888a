// Helpers shared by the offload tests (test_offload, test_offload_nvme): bit-for-bit comparison that names the
// first difference, and one training step of a DistCase.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dist/equivalence.h"
#include "test_helpers.h"

namespace dscpp::test {

// Bit for bit, naming the first element that differs.
inline void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " differ; first at " << first << ": "
                        << got[first] << " against " << want[first];
}

inline std::vector<float> floats(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  return {h.data<float>(), h.data<float>() + h.numel()};
}

// One step of case c on this rank: gas micro-batches of step `batch_step` (the data), poisoning one owned gradient
// with inf before the boundary when asked.
inline void train_step(Engine& e, const DistCase& c, int rank, int64_t batch_step, bool poison = false) {
  Tensor x = Tensor::empty({batch(c), seq(c)}, DType::i32), y = Tensor::empty({batch(c), seq(c)}, DType::i32);
  for (int64_t m = 0; m < c.gas; m++) {
    micro_batch(c, batch_step, rank * c.gas + m, x, y);
    e.forward(x, y);
    e.backward();
    if (poison && m == c.gas - 1) {
      Tensor g = e.owned_grads(0);
      store_from_float(g, 3, std::numeric_limits<float>::infinity());
    }
    e.step();
  }
}

}  // namespace dscpp::test
