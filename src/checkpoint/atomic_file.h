// Crash-safe files and directories on POSIX file systems.
// A file is written to "<path>.tmp.<pid>", fsynced, renamed over the target, and the directory is fsynced, so a
// reader sees the old file or the new one, never a torn one. A directory (a checkpoint tag) is built under
// "<dir>.tmp", fsynced file by file, and renamed into place, so it appears complete or not at all.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dscpp {

// Sequential writer to one file, counting bytes and the CRC32 of everything written (for manifests).
class FileWriter {
 public:
  explicit FileWriter(std::string path);  // creates or truncates; throws CheckpointError
  ~FileWriter();                          // closes (without fsync) if close_synced() was not called
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void close_synced();  // fsync, then close; errors name the file
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// A file that replaces `path` atomically on commit(); dropped (temp file removed) if never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  FileWriter& writer() { return *out_; }
  void write(const void* data, size_t n) { out_->write(data, n); }
  void write(std::string_view s) { out_->write(s); }
  void commit();  // fsync file, rename over target, fsync parent directory

 private:
  std::string path_, tmp_;
  std::unique_ptr<FileWriter> out_;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, std::string_view contents);
void fsync_dir(const std::string& dir);         // throws CheckpointError(io)
void fsync_tree(const std::string& dir);        // every file and directory below dir, then dir itself

// A directory that appears at `final_path` complete or not at all. Files go under tmp_path() = "<final>.tmp"
// (a stale one from a crashed run is removed first). commit() = sync() + rename_into_place(); they are separate so
// a caller can do work between them. If final_path exists it is swapped out atomically (renameat2 EXCHANGE) and
// then removed. Dropped without commit, the temp directory is removed.
class AtomicDir {
 public:
  explicit AtomicDir(std::string final_path);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& tmp_path() const { return tmp_; }
  const std::string& final_path() const { return final_; }
  bool committed() const { return committed_; }
  void sync();
  void rename_into_place();
  void commit() { sync(); rename_into_place(); }

 private:
  std::string final_, tmp_;
  bool committed_ = false;
};

}  // namespace dscpp
