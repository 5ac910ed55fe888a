// SwapFile: one file of a swap folder, open for O_DIRECT reads and writes through an AioHandle (swap/aio_handle.h).
// Its blocks are reserved when it is created, so a disk too small fails there, before training, rather than in the
// middle of a step; reserved blocks read as zeros.
#pragma once
#include <cstdint>
#include <string>

namespace dscpp {

// O_DIRECT's granularity, for buffers, lengths and offsets: the largest logical block size of common disks.
constexpr int64_t kAioAlignment = 4096;
inline int64_t aio_aligned(int64_t bytes) { return (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment; }

class SwapFile {
 public:
  SwapFile() = default;
  // Creates (or empties) `path`, `bytes` long (a multiple of kAioAlignment), with its blocks reserved
  // (posix_fallocate; sparse where the file system cannot reserve). Throws naming the path, the bytes and the
  // system's error: no space, a file size limit, a file system that refuses O_DIRECT.
  static SwapFile create(const std::string& path, int64_t bytes);
  ~SwapFile();
  SwapFile(SwapFile&& o) noexcept;
  SwapFile& operator=(SwapFile&& o) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  int64_t bytes() const { return bytes_; }

 private:
  int fd_ = -1;
  std::string path_;
  int64_t bytes_ = 0;
};

}  // namespace dscpp
