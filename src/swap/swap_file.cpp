// SwapFile (swap/swap_file.h): an O_DIRECT file with its blocks reserved up front.
#include "dscpp/swap/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "dscpp/core/check.h"

namespace dscpp {

SwapFile SwapFile::create(const std::string& path, int64_t bytes) {
  DSCPP_CHECK(bytes >= 0 && bytes % kAioAlignment == 0, "swap file ", path, ": ", bytes,
              " bytes is not a multiple of ", kAioAlignment, " (O_DIRECT)");
  SwapFile f;
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (f.fd_ < 0 && errno == EINVAL)
    DSCPP_FAIL("swap file ", path, ": the file system refuses O_DIRECT (tmpfs or a network file system?); put "
               "nvme_path on a local disk");
  if (f.fd_ < 0) DSCPP_FAIL("swap file ", path, ": cannot create it: ", std::strerror(errno));
  f.path_ = path;
  f.bytes_ = bytes;
  if (bytes == 0) return f;
  int r = ::posix_fallocate(f.fd_, 0, bytes);  // returns the error, not -1
  if (r == EOPNOTSUPP || r == EINVAL) r = ::ftruncate(f.fd_, bytes) == 0 ? 0 : errno;  // sparse, reads as zeros
  if (r != 0) DSCPP_FAIL("swap file ", path, ": reserving ", bytes, " bytes failed: ", std::strerror(r));
  return f;
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) ::close(fd_);
}

SwapFile::SwapFile(SwapFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), bytes_(std::exchange(o.bytes_, 0)) {}

SwapFile& SwapFile::operator=(SwapFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace dscpp
