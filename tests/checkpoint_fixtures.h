// Helpers shared by the checkpoint tests (test_checkpoint_io, _sharded, _async): a fresh directory per test, tensors
// of random bytes, whole-file reads and writes, and the expected-CheckpointError check.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>

#include "dscpp/checkpoint/checkpoint_error.h"
#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "scratch_dirs.h"

namespace dscpp::test_fixtures {

// <tmp>/<prefix>_<pid>_<test name> (a parameterized test's "/" as "_": one directory), emptied and created; removed
// when the test passes (scratch_dirs.h).
inline std::string checkpoint_test_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& ch : name)
    if (ch == '/') ch = '_';
  std::string d = (fs::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + name)).string();
  fs::remove_all(d);
  fs::create_directories(d);
  remove_when_passed(d);
  return d;
}

// Random bit patterns (NaNs included for floats: a round trip must preserve bytes, not values).
inline Tensor random_tensor(const Shape& s, DType t, uint64_t seed) {
  Tensor x = Tensor::empty(s, t);
  Rng rng(seed);
  auto* p = static_cast<uint8_t*>(x.raw());
  for (size_t i = 0; i < x.nbytes(); i++) p[i] = uint8_t(rng.next_u32());
  return x;
}

inline std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// Runs fn, expects a CheckpointError of `kind` whose message contains every needle.
template <typename Fn>
void expect_ckpt_error(Fn fn, CheckpointErrorKind kind, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected CheckpointError(" << checkpoint_error_kind_name(kind) << "), nothing thrown";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind, kind) << "got " << checkpoint_error_kind_name(e.kind) << ": " << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message lacks \"" << n << "\": " << e.what();
  }
}

}  // namespace dscpp::test_fixtures
