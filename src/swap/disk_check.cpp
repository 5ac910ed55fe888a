// A swap folder's free space and measured speed (swap/disk_check.h).
#include "dscpp/swap/disk_check.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>

#include "dscpp/core/check.h"

namespace dscpp {

int64_t disk_free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) DSCPP_FAIL("statvfs ", dir, ": ", std::strerror(errno));
  return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

std::string disk_bytes_text(int64_t bytes) {
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.2f", double(bytes) / double(int64_t(1) << 30));
  return std::string(gib) + " GiB (" + std::to_string(bytes) + " bytes)";
}

DiskSpeed probe_disk(const std::string& dir, int64_t bytes, AioHandle& aio) {
  DiskSpeed d;
  d.bytes = aio_aligned(bytes);
  if (d.bytes == 0) return d;
  const std::string path = dir + "/probe.tensor.swp";
  // Written in pieces of at most 64 MiB from one buffer, so a long probe needs no more memory than that.
  const int64_t piece = std::min<int64_t>(d.bytes, int64_t(64) << 20);
  Tensor buf = aio_buffer(piece / 4, DType::i32, /*pinned=*/true);
  int32_t* w = buf.data<int32_t>();
  for (int64_t i = 0; i < piece / 4; i++) w[i] = int32_t(i * 2654435761u);  // not zeros: compressing disks exist
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  {
    SwapFile f = SwapFile::create(path, d.bytes);
    ::unlink(path.c_str());  // gone whatever happens next; the open descriptor keeps the blocks until closed
    auto pass = [&](bool write) {
      const auto t0 = Clock::now();
      for (int64_t at = 0; at < d.bytes; at += piece) {
        const int64_t n = std::min(piece, d.bytes - at);
        aio.wait(write ? aio.write(f, buf.raw(), n, at) : aio.read(f, buf.raw(), n, at));
      }
      return d.bytes / seconds(t0) / 1e9;
    };
    d.write_gbps = pass(true);
    std::memset(buf.raw(), 0xff, size_t(piece));
    d.read_gbps = pass(false);
  }
  for (int64_t i = 0; i < piece / 4; i++)
    DSCPP_CHECK(w[i] == int32_t(i * 2654435761u), "disk probe in ", dir, ": read back different bytes than written "
                "at byte ", 4 * i, " of the last ", piece, " (the disk or the file system loses O_DIRECT writes)");
  return d;
}

}  // namespace dscpp
