// Crash-safe files and directories. The rules POSIX gives us: rename() within one file system is atomic; data and
// a new directory entry are durable only after fsync of the file and of the directory holding the entry.
#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dscpp/checkpoint/checkpoint_error.h"
#include "dscpp/checkpoint/crc32.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
[[noreturn]] void io_fail(const std::string& path, const char* what, int err) {
  checkpoint_fail(CheckpointErrorKind::io, path, ": ", what, " failed: ", std::strerror(err));
}

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void fsync_path(const std::string& path, bool is_dir) {
  int fd = ::open(path.c_str(), (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) io_fail(path, "open for fsync", errno);
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    io_fail(path, "fsync", e);
  }
  ::close(fd);
}
}  // namespace

// ---- FileWriter ----

FileWriter::FileWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail(path_, "create", errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  DSCPP_CHECK(fd_ >= 0, path_, ": write after close");
  crc_ = crc32_update(crc_, data, n);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) io_fail(path_, "write", errno);
    p += w;
    n -= size_t(w);
    bytes_ += uint64_t(w);
  }
}

void FileWriter::close_synced() {
  DSCPP_CHECK(fd_ >= 0, path_, ": closed twice");
  int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    io_fail(path_, "fsync", e);
  }
  if (::close(fd) != 0) io_fail(path_, "close", errno);
}

// ---- AtomicFile ----

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())),
      out_(std::make_unique<FileWriter>(tmp_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    out_.reset();
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::commit() {
  DSCPP_CHECK(!committed_, path_, ": committed twice");
  out_->close_synced();
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) io_fail(tmp_ + " -> " + path_, "rename", errno);
  committed_ = true;
  fsync_dir(parent_of(path_));
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

void fsync_dir(const std::string& dir) { fsync_path(dir, true); }

void fsync_tree(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink()) continue;
    fsync_path(it->path().string(), it->is_directory());
  }
  if (ec) checkpoint_fail(CheckpointErrorKind::io, dir, ": listing failed: ", ec.message());
  fsync_dir(dir);
}

// ---- AtomicDir ----

AtomicDir::AtomicDir(std::string final_path) : final_(std::move(final_path)), tmp_(final_ + ".tmp") {
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // left by a crashed writer
  if (ec) checkpoint_fail(CheckpointErrorKind::io, tmp_, ": cannot remove stale directory: ", ec.message());
  fs::create_directories(tmp_, ec);
  if (ec) checkpoint_fail(CheckpointErrorKind::io, tmp_, ": cannot create directory: ", ec.message());
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);  // best effort; a leftover is removed by the next writer of this tag
  }
}

void AtomicDir::sync() { fsync_tree(tmp_); }

void AtomicDir::rename_into_place() {
  DSCPP_CHECK(!committed_, final_, ": committed twice");
  std::error_code ec;
  bool replacing = fs::exists(fs::symlink_status(final_, ec));
  if (!replacing) {
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) io_fail(tmp_ + " -> " + final_, "rename", errno);
  } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) != 0) {
    // No atomic exchange on this file system: move the old directory aside first. A crash between the two
    // renames leaves no directory at final_ (the old one survives as "<final>.old").
    if (errno != EINVAL && errno != ENOSYS) io_fail(tmp_ + " <-> " + final_, "rename exchange", errno);
    std::string old = final_ + ".old";
    fs::remove_all(old, ec);
    if (::rename(final_.c_str(), old.c_str()) != 0) io_fail(final_ + " -> " + old, "rename", errno);
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) io_fail(tmp_ + " -> " + final_, "rename", errno);
    fs::remove_all(old, ec);
  }
  committed_ = true;
  fsync_dir(parent_of(final_));
  if (replacing) fs::remove_all(tmp_, ec);  // after an exchange tmp_ holds the old directory
}

}  // namespace dscpp
