// What the swap tests (test_swap, test_offload_nvme) need of this machine, and why they skip without it.
#pragma once
#include <filesystem>
#include <string>

#include "dscpp/swap/aio_config.h"
#include "dscpp/swap/swap_file.h"

namespace dscpp::test {

// "" when swap files can be made in `dir` here; else why not: a build without liburing and libaio, or a file
// system that refuses O_DIRECT (a tmpfs /tmp: point TMPDIR at a local disk).
inline std::string swap_unavailable(const std::string& dir) {
  if (!aio_missing_libraries().empty()) return aio_missing_libraries();
  try {
    std::filesystem::create_directories(dir);
    SwapFile::create(dir + "/can_swap.tensor.swp", kAioAlignment);
    std::filesystem::remove(dir + "/can_swap.tensor.swp");
  } catch (const std::exception& e) {
    return std::string(e.what()) + " (point TMPDIR at a folder on a local disk)";
  }
  return "";
}

}  // namespace dscpp::test
