// Note [Crash handler]: a segmentation fault on one rank of a multi-process job otherwise leaves only the
// launcher's "killed by signal 11" and no way to tell where; reproducing it under a debugger changes the timing
// that caused it. The handler writes with async-signal-safe calls only (write, backtrace_symbols_fd), then restores
// the default action and re-raises.
#include "dscpp/core/crash_handler.h"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace dscpp {

namespace {

char g_rank[16] = "?";

void put(const char* s) {
  const ssize_t n = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)n;
}

void on_fatal_signal(int sig) {
  put("\n*** dscpp: fatal signal ");
  char num[12];
  int i = int(sizeof num) - 1;
  num[i] = '\0';
  int v = sig;
  do num[--i] = char('0' + v % 10); while ((v /= 10) > 0 && i > 0);
  put(num + i);
  put(" (");
  put(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
  put(") on rank ");
  put(g_rank);
  put("; backtrace:\n");
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_crash_handler() {
  if (const char* r = std::getenv("RANK"); r && std::strlen(r) < sizeof g_rank) std::strcpy(g_rank, r);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now: the first call may allocate, which a handler must not
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_fatal_signal);
}

}  // namespace dscpp
