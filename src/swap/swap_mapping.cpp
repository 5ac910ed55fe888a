// SwapMapping (swap/swap_mapping.h): a reserved swap file mapped MAP_SHARED.
#include "dscpp/swap/swap_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "dscpp/core/check.h"

namespace dscpp {

SwapMapping SwapMapping::create(const std::string& path, int64_t bytes) {
  DSCPP_CHECK(bytes >= 1, "swap mapping ", path, ": ", bytes, " bytes");
  SwapMapping m;
  m.path_ = path;
  m.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (m.fd_ < 0) DSCPP_FAIL("swap file ", path, ": cannot create it: ", std::strerror(errno));
  // Reserved, not sparse: a page first written to a sparse mapping on a full disk kills the process with SIGBUS.
  if (const int r = ::posix_fallocate(m.fd_, 0, bytes); r != 0)
    DSCPP_FAIL("swap file ", path, ": reserving ", bytes, " bytes failed: ", std::strerror(r));
  m.bytes_ = bytes;
  void* p = ::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_, 0);
  if (p == MAP_FAILED) DSCPP_FAIL("swap file ", path, ": cannot map ", bytes, " bytes: ", std::strerror(errno));
  m.data_ = p;
  return m;
}

void SwapMapping::release() {
  if (data_) ::munmap(data_, size_t(bytes_));
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

SwapMapping::~SwapMapping() { release(); }

SwapMapping::SwapMapping(SwapMapping&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      path_(std::move(o.path_)) {}

SwapMapping& SwapMapping::operator=(SwapMapping&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

static int64_t page_size() { return int64_t(::sysconf(_SC_PAGESIZE)); }

void SwapMapping::prefetch(int64_t offset, int64_t bytes) const {
  if (!data_ || bytes <= 0) return;
  const int64_t page = page_size(), begin = std::max<int64_t>(0, offset) / page * page;
  const int64_t end = std::min(bytes_, offset + bytes);
  if (end > begin) ::madvise(static_cast<char*>(data_) + begin, size_t(end - begin), MADV_WILLNEED);
}

}  // namespace dscpp
