// The tests' scratch directories are removed when the test that made them passes, a program's shared ones when its
// tests are done (a failure keeps them, named on stderr, for a look), so that a test run leaves nothing in the
// temporary directory. A fork()ed rank (dist/multiprocess.h) starts with none of its parent's and removes its own
// when it ends cleanly.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace dscpp::test_fixtures {

inline std::vector<std::string>& scratch_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// A folder the whole test program shares, removed when its tests are done.
inline std::vector<std::string>& program_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

inline void remove_scratch_dirs() {
  for (const std::string& d : scratch_dirs()) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
  scratch_dirs().clear();
}

class ScratchDirCleaner : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return remove_scratch_dirs();
    for (const std::string& d : scratch_dirs()) std::fprintf(stderr, "kept for a look: %s\n", d.c_str());
    scratch_dirs().clear();
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    for (const std::string& d : program_dirs()) {
      std::error_code ec;
      if (unit.Passed()) std::filesystem::remove_all(d, ec);
      else std::fprintf(stderr, "kept for a look: %s\n", d.c_str());
    }
  }
};

inline void register_cleaner() {
  static const bool registered = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new ScratchDirCleaner);
    return true;
  }();
  (void)registered;
}

// d is removed when the current test ends, unless it failed.
inline void remove_when_passed(const std::string& d) {
  register_cleaner();
  scratch_dirs().push_back(d);
}

// d (once) is removed when the program's tests are done, unless one failed.
inline void remove_when_tests_end(const std::string& d) {
  register_cleaner();
  for (const std::string& k : program_dirs())
    if (k == d) return;
  program_dirs().push_back(d);
}

}  // namespace dscpp::test_fixtures
