// Checkpoint directories, DeepSpeed's layout in spirit:
//   save_dir/latest            text: the newest complete tag (written atomically, LAST)
//   save_dir/<tag>/            named files (safetensors, JSON), plus manifest.json:
//     {"format": "dscpp-checkpoint", "format_version": 1, "tag": ..., "created_unix_ns": ...,
//      "files": {"<name>": {"bytes": N, "crc32": C}}}      (C as zlib.crc32 computes it)
// Everything is readable without this library (safetensors + JSON + zlib). See Note [Commit protocol] in
// src/checkpoint/checkpoint_io.cpp for why a crash at any point leaves the previous tag loadable.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/checkpoint_error.h"
#include "dscpp/checkpoint/safetensors.h"

namespace dscpp {

class AtomicDir;
inline constexpr int kCheckpointFormatVersion = 1;

struct FileRecord {
  std::string name;  // relative to the tag directory; may contain '/' (e.g. "zero/<param>/fp32.safetensors")
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Writes one tag. Files stream to disk as they are added (nothing is held in memory); commit() makes them visible.
// Not committed (exception, early return), the partial "<tag>.tmp" is removed. One writer per tag at a time: a
// new writer removes a "<tag>.tmp" it finds (the leftover of a crash).
class CheckpointWriter {
 public:
  CheckpointWriter(std::string save_dir, std::string tag);
  ~CheckpointWriter();

  void add_tensors(const std::string& file_name, const NamedTensors& tensors, const StringMap& metadata = {});
  void add_json(const std::string& file_name, const nlohmann::json& j);
  // fsync everything, write manifest.json, rename "<tag>.tmp" to "<tag>", then (optionally) rewrite `latest`.
  void commit(bool update_latest = true);

  const std::string& tag() const { return tag_; }
  const std::vector<FileRecord>& files() const { return files_; }

 private:
  std::string begin_file(const std::string& file_name);  // validates the name, returns the temp path
  std::string save_dir_, tag_;
  std::unique_ptr<AtomicDir> dir_;
  std::vector<FileRecord> files_;
  bool committed_ = false;
};

// Reads one tag. The constructor verifies the manifest (every file present, sizes match and, unless verify_crc is
// false, CRC32s match) before anything can be read; only files listed in the manifest can be read.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string save_dir, std::string tag = "" /* "" reads `latest` */,
                            bool verify_crc = true);

  const std::string& tag() const { return tag_; }
  std::string dir() const { return save_dir_ + "/" + tag_; }
  const std::vector<FileRecord>& files() const { return files_; }
  bool has_file(const std::string& file_name) const;

  std::map<std::string, Tensor> read_tensors(const std::string& file_name) const;
  // Loads each named tensor into its destination; dtype/shape mismatches and unknown tensors are errors, all
  // checked before any byte is read. strict: the file may not hold tensors that have no destination.
  void read_into(const std::string& file_name, const NamedTensors& dsts, bool strict = true) const;
  SafetensorsFile open_tensors(const std::string& file_name) const;  // metadata, entries, partial reads
  nlohmann::json read_json(const std::string& file_name) const;
  std::vector<std::string> tags() const;  // list_tags(save_dir)

 private:
  std::string path_of(const std::string& file_name) const;  // checks the file is in the manifest
  std::string save_dir_, tag_;
  std::vector<FileRecord> files_;
};

std::string read_latest_tag(const std::string& save_dir);      // throws CheckpointError(missing_latest)
std::vector<std::string> list_tags(const std::string& save_dir);  // complete tags, oldest commit first
// Deletes all but the newest keep_last complete tags (remove_tag); never the one `latest` names.
void prune_old_tags(const std::string& save_dir, int keep_last);
// Deletes one tag: renamed to "<tag>.tmp" first, so a kill midway leaves what an interrupted save leaves.
void remove_tag(const std::string& save_dir, const std::string& tag);

// Deletes every tag (remove_tag), `latest`, `latest_universal` and the removable leftovers: a new run started
// over. Anything else in save_dir stays.
void remove_all_checkpoints(const std::string& save_dir);

// Which tag a resumed run loads: the one `latest` names; without `latest` (a hand-deleted file, a copy that
// missed it), the newest tag whose manifest and files verify, and *note says so. "" when there is none: *note then
// says what save_dir holds.
std::string find_resume_tag(const std::string& save_dir, std::string* note);

// Folders in save_dir that are not complete tags. "<tag>.tmp" is an interrupted save or prune: removable, and the
// next save (rank 0, after its commit) removes it. Any other folder without manifest.json (an older version's
// interrupted prune, or not ours) and "<tag>.old" (an interrupted replacement of a tag: maybe its only copy) are
// only reported.
struct CheckpointLeftover {
  std::string name;
  bool removable = false;
  std::string what;  // for `dscpp ckpt inspect`
};
std::vector<CheckpointLeftover> checkpoint_leftovers(const std::string& save_dir);
void remove_checkpoint_leftovers(const std::string& save_dir);  // the removable ones; best effort

}  // namespace dscpp
