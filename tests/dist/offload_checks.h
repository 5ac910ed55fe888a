// What the offload tests share (test_offload.cpp, test_offload_nvme.cpp, test_param_offload.cpp): config errors by key, and bit-for-bit
// checks of offloaded runs against the same run without offload (on the CPU device the offload paths run the same
// kernels on the same values, so every bit must agree).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "dist/equivalence.h"
#include "test_helpers.h"

namespace dscpp::test {

// A config with a micro-batch of 2 and `body`'s keys.
inline DeepSpeedConfig parse_config(const std::string& body, std::vector<std::string>* warnings = nullptr) {
  return DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 2, )" + body + "}", 1, warnings);
}

// parse_config(body) fails on `key`, its message holding each of `parts`.
inline void expect_config_error(const std::string& body, const std::string& key,
                                const std::vector<std::string>& parts) {
  try {
    parse_config(body);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, key) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

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

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
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

// Trains `got` (case c) and `want` (case ref) 4 steps each on this rank: gradients, norms, losses and the parameters
// after them agree bit for bit, and something trained.
inline void expect_same_training(Engine& got_engine, const DistCase& c, Engine& want_engine, const DistCase& ref,
                                 int rank) {
  const Trained got = train(got_engine, c, rank, c.gas, 4), want = train(want_engine, ref, rank, ref.gas, 4);
  const std::string what = c.name() + " rank " + std::to_string(rank);
  expect_bits(got.grads, want.grads, what + ": step-0 gradients");
  expect_bits(got.norms, want.norms, what + ": gradient norms");
  expect_bits(got.losses, want.losses, what + ": losses");
  expect_bits(got.params, want.params, what + ": parameters after 4 steps");
  EXPECT_NE(got.params, got.init) << what << ": nothing trained";
}

}  // namespace dscpp::test
