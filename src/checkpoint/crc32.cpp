#include "dscpp/checkpoint/crc32.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "dscpp/checkpoint/checkpoint_error.h"

namespace dscpp {

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;  // zlib returns 0 (the initial value) for a null buffer, even mid-stream
  return uint32_t(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

uint32_t file_crc32(const std::string& path, uint64_t* bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) checkpoint_fail(CheckpointErrorKind::missing_file, path, ": missing file");
    checkpoint_fail(CheckpointErrorKind::io, path, ": cannot open: ", std::strerror(errno));
  }
  std::vector<char> buf(size_t(4) << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      checkpoint_fail(CheckpointErrorKind::io, path, ": read failed: ", std::strerror(e));
    }
    if (r == 0) break;
    crc = crc32_update(crc, buf.data(), size_t(r));
    total += uint64_t(r);
  }
  ::close(fd);
  if (bytes) *bytes = total;
  return crc;
}

}  // namespace dscpp
