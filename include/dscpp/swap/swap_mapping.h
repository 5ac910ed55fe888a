// SwapMapping: a swap file mapped into the address space (MAP_SHARED), for data that the program addresses as one
// tensor but that need not stay in host memory: the kernel pages it in on use and writes dirty pages back to the
// file, so host memory holds only what its page cache keeps. Its blocks are reserved when it is created, so a full
// disk fails there rather than as a SIGBUS when a page is first written.
#pragma once
#include <cstdint>
#include <string>

namespace dscpp {

class SwapMapping {
 public:
  SwapMapping() = default;
  // Creates (or empties) `path` with `bytes` reserved (posix_fallocate; a file system that cannot reserve is
  // refused) and maps it read-write. Throws naming the path, the bytes and the system's error.
  static SwapMapping create(const std::string& path, int64_t bytes);
  ~SwapMapping();  // unmaps and closes; the file stays (its folder's owner removes it)
  SwapMapping(SwapMapping&& o) noexcept;
  SwapMapping& operator=(SwapMapping&& o) noexcept;
  SwapMapping(const SwapMapping&) = delete;
  SwapMapping& operator=(const SwapMapping&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }
  // Starts reading [offset, offset + bytes) from the disk in the background (madvise WILLNEED), so that the copy
  // that uses it next finds it in memory.
  void prefetch(int64_t offset, int64_t bytes) const;

 private:
  void release();
  int fd_ = -1;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  std::string path_;
};

}  // namespace dscpp
