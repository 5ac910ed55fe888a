// install_crash_handler: on a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) print, to stderr, the signal,
// the rank (from RANK, when set) and a backtrace of the crashing thread, then die of the same signal, so a
// launcher still sees how the process ended. Call once, early in main. Symbol names need the executable linked with
// exported symbols (CMake ENABLE_EXPORTS); without them the frames are addresses (addr2line -e BINARY).
#pragma once

namespace dscpp {
void install_crash_handler();
}
