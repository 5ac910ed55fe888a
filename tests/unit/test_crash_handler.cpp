// install_crash_handler (Note [Crash handler]): a fatal signal prints the signal, the rank and a backtrace with
// frames (addresses, named where the binary exports its symbols), and the process still dies of that signal.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include "dscpp/core/crash_handler.h"

namespace {

[[gnu::noinline]] void crash_here_for_the_test(int sig) { std::raise(sig); }

void crash(int sig) {
  setenv("RANK", "5", 1);
  dscpp::install_crash_handler();
  crash_here_for_the_test(sig);
}

}  // namespace

TEST(CrashHandler, SegfaultPrintsRankAndBacktrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(crash(SIGSEGV), testing::KilledBySignal(SIGSEGV),
              "fatal signal 11 \\(SEGV\\) on rank 5; backtrace:\n.*\\[0x[0-9a-f]+\\]");
}

TEST(CrashHandler, AbortToo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(crash(SIGABRT), testing::KilledBySignal(SIGABRT), "fatal signal 6 \\(ABRT\\) on rank 5");
}
