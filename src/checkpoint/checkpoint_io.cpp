// Checkpoint directories: writer, verifying reader, `latest`, pruning.
//
// Note [Commit protocol]
// ~~~~~~~~~~~~~~~~~~~~~~
// A save must never damage the previous checkpoint, whatever instant the process dies at. The writer:
//   1. streams every file into "<save_dir>/<tag>.tmp/" (fsync each file; CRC32 computed while writing)
//   2. writes manifest.json (sizes, CRCs, format version) into the temp dir       [fault: before_manifest]
//   3. fsyncs the whole temp tree, renames it to "<save_dir>/<tag>", fsyncs save_dir  [fault: before_rename]
//   4. rewrites "<save_dir>/latest" atomically (temp file + rename + fsync)          [fault: before_latest]
// Until 3 nothing named <tag> exists; until 4 `latest` names the previous tag. A "<tag>.tmp" left by a crash is
// ignored by readers and removed by the next writer of that tag. A reader trusts nothing: it re-checks every
// file's size and CRC32 against the manifest before returning data, so a torn or bit-rotted file is an error
// naming that file, never a silent wrong load.
//
// Designed to grow (later issue): sharded ZeRO saves have each rank write its own files into the same temp dir and
// send its FileRecords to rank 0, which writes the manifest and commits; universal checkpoints use file names
// with subdirectories ("zero/<param>/fp32.safetensors"); async writes move step 1 to a background thread and
// keep 2-4 unchanged.
#include "dscpp/checkpoint/checkpoint_io.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/atomic_file.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/checkpoint/crc32.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "dscpp-checkpoint";

void check_tag(const std::string& tag, const std::string& where = "") {
  bool bad = tag.empty() || tag == "." || tag == ".." || tag == "latest" || tag.find('/') != std::string::npos ||
             tag.find('\0') != std::string::npos || tag.ends_with(".tmp") || tag.ends_with(".old");
  if (bad) checkpoint_fail(K::bad_argument, where, where.empty() ? "" : ": ", "invalid checkpoint tag \"", tag, "\"");
}

// Relative path inside a tag: no absolute path, no "." / ".." components, not the manifest.
void check_file_name(const std::string& tag_dir, const std::string& name) {
  bool bad = name.empty() || name == kManifest || name.front() == '/' || name.back() == '/';
  for (const auto& part : fs::path(name)) bad = bad || part == "." || part == ".." || part.empty();
  if (bad) checkpoint_fail(K::bad_argument, tag_dir, ": invalid file name \"", name, "\"");
}

std::string read_text(const std::string& path, K missing_kind, const std::string& missing_msg) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::error_code ec;
    if (!fs::exists(path, ec)) checkpoint_fail(missing_kind, path, ": ", missing_msg);
    checkpoint_fail(K::io, path, ": cannot open");
  }
  std::ostringstream os;
  os << f.rdbuf();
  if (f.bad()) checkpoint_fail(K::io, path, ": read failed");
  return os.str();
}

nlohmann::json parse_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, path, ": invalid JSON: ", e.what());
  }
}

int64_t created_ns(const std::string& manifest_path) {
  try {
    std::ifstream f(manifest_path);
    return nlohmann::json::parse(f).at("created_unix_ns").get<int64_t>();
  } catch (const std::exception&) {
    return 0;  // unreadable manifest: sorts as oldest (and its tag fails to load with a precise error)
  }
}
}  // namespace

// ---- writer ----

CheckpointWriter::CheckpointWriter(std::string save_dir, std::string tag)
    : save_dir_(std::move(save_dir)), tag_(std::move(tag)) {
  check_tag(tag_);
  std::error_code ec;
  fs::create_directories(save_dir_, ec);
  if (ec) checkpoint_fail(K::io, save_dir_, ": cannot create directory: ", ec.message());
  dir_ = std::make_unique<AtomicDir>(save_dir_ + "/" + tag_);
}

CheckpointWriter::~CheckpointWriter() = default;  // AtomicDir removes an uncommitted temp dir

std::string CheckpointWriter::begin_file(const std::string& file_name) {
  DSCPP_CHECK(!committed_, save_dir_, "/", tag_, ": add after commit");
  check_file_name(dir_->tmp_path(), file_name);
  for (const auto& r : files_)
    if (r.name == file_name) checkpoint_fail(K::bad_argument, dir_->tmp_path(), ": file ", file_name, " added twice");
  std::string path = dir_->tmp_path() + "/" + file_name;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) checkpoint_fail(K::io, path, ": cannot create parent directory: ", ec.message());
  return path;
}

void CheckpointWriter::add_tensors(const std::string& file_name, const NamedTensors& tensors,
                                   const StringMap& metadata) {
  FileWriter out(begin_file(file_name));
  write_safetensors(out, tensors, metadata);
  out.close_synced();
  files_.push_back({file_name, out.bytes(), out.crc32()});
}

void CheckpointWriter::add_json(const std::string& file_name, const nlohmann::json& j) {
  FileWriter out(begin_file(file_name));
  out.write(j.dump(2) + "\n");
  out.close_synced();
  files_.push_back({file_name, out.bytes(), out.crc32()});
}

void CheckpointWriter::commit(bool update_latest) {
  DSCPP_CHECK(!committed_, save_dir_, "/", tag_, ": committed twice");
  checkpoint_fault_point(FaultPoint::before_manifest);
  nlohmann::ordered_json m;
  m["format"] = kFormat;
  m["format_version"] = kCheckpointFormatVersion;
  m["tag"] = tag_;
  m["created_unix_ns"] =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  m["files"] = nlohmann::ordered_json::object();
  for (const auto& r : files_) m["files"][r.name] = {{"bytes", r.bytes}, {"crc32", r.crc32}};
  FileWriter out(dir_->tmp_path() + "/" + kManifest);
  out.write(m.dump(2) + "\n");
  out.close_synced();

  dir_->sync();
  checkpoint_fault_point(FaultPoint::before_rename);
  dir_->rename_into_place();
  committed_ = true;
  checkpoint_fault_point(FaultPoint::before_latest);
  if (update_latest) write_file_atomic(save_dir_ + "/latest", tag_);
}

// ---- reader ----

CheckpointReader::CheckpointReader(std::string save_dir, std::string tag, bool verify_crc)
    : save_dir_(std::move(save_dir)), tag_(std::move(tag)) {
  bool from_latest = tag_.empty();
  if (from_latest) tag_ = read_latest_tag(save_dir_);
  check_tag(tag_, from_latest ? save_dir_ + "/latest" : save_dir_);
  const std::string d = dir();
  std::error_code ec;
  if (!fs::is_directory(d, ec))
    checkpoint_fail(K::tag_not_found, d, ": tag not found",
                    from_latest ? " (named by " + save_dir_ + "/latest)" : std::string());
  const std::string mpath = d + "/" + kManifest;
  nlohmann::json m = parse_json(read_text(mpath, K::tag_not_found, "missing manifest (incomplete checkpoint)"), mpath);
  try {
    if (m.at("format").get<std::string>() != kFormat)
      checkpoint_fail(K::bad_header, mpath, ": format is \"", m.at("format").get<std::string>(), "\", expected \"",
                      kFormat, "\"");
    int v = m.at("format_version").get<int>();
    if (v < 1 || v > kCheckpointFormatVersion)
      checkpoint_fail(K::bad_header, mpath, ": format_version ", v, " is not supported (this build reads 1..",
                      kCheckpointFormatVersion, ")");
    for (const auto& [name, rec] : m.at("files").items())
      files_.push_back({name, rec.at("bytes").get<uint64_t>(), rec.at("crc32").get<uint32_t>()});
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, mpath, ": malformed manifest: ", e.what());
  }

  for (const auto& r : files_) {
    check_file_name(d, r.name);
    const std::string p = d + "/" + r.name;
    auto size = fs::file_size(p, ec);
    if (ec) {
      if (!fs::exists(p)) checkpoint_fail(K::missing_file, p, ": missing file (listed in ", mpath, ")");
      checkpoint_fail(K::io, p, ": cannot stat: ", ec.message());
    }
    if (uint64_t(size) != r.bytes)
      checkpoint_fail(K::truncated, p, ": size mismatch (truncated?): ", size, " bytes, manifest says ", r.bytes);
    if (!verify_crc) continue;
    uint32_t crc = file_crc32(p);
    if (crc != r.crc32)
      checkpoint_fail(K::corrupted, p, ": corrupted: CRC32 ", crc, " but manifest says ", r.crc32);
  }
}

bool CheckpointReader::has_file(const std::string& file_name) const {
  return std::any_of(files_.begin(), files_.end(), [&](const FileRecord& r) { return r.name == file_name; });
}

std::string CheckpointReader::path_of(const std::string& file_name) const {
  if (!has_file(file_name))
    checkpoint_fail(K::missing_file, dir(), "/", file_name, ": missing file (not in the manifest of tag ", tag_, ")");
  return dir() + "/" + file_name;
}

SafetensorsFile CheckpointReader::open_tensors(const std::string& file_name) const {
  return SafetensorsFile(path_of(file_name));
}

std::map<std::string, Tensor> CheckpointReader::read_tensors(const std::string& file_name) const {
  return open_tensors(file_name).read_all();
}

void CheckpointReader::read_into(const std::string& file_name, const NamedTensors& dsts, bool strict) const {
  open_tensors(file_name).read_all_into(dsts, strict);
}

nlohmann::json CheckpointReader::read_json(const std::string& file_name) const {
  std::string p = path_of(file_name);
  return parse_json(read_text(p, K::missing_file, "missing file"), p);
}

std::vector<std::string> CheckpointReader::tags() const { return list_tags(save_dir_); }

// ---- latest, listing, pruning ----

std::string read_latest_tag(const std::string& save_dir) {
  const std::string p = save_dir + "/latest";
  std::string t = read_text(p, K::missing_latest, "missing `latest` (no checkpoint committed in this directory)");
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(t.begin());
  if (t.empty()) checkpoint_fail(K::missing_latest, p, ": `latest` is empty");
  return t;
}

std::vector<std::string> list_tags(const std::string& save_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(save_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!it->is_directory() || name.ends_with(".tmp") || name.ends_with(".old")) continue;
    std::string m = it->path().string() + "/" + kManifest;
    if (fs::exists(m)) found.emplace_back(created_ns(m), name);
  }
  if (ec && fs::exists(save_dir)) checkpoint_fail(K::io, save_dir, ": listing failed: ", ec.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [t, name] : found) tags.push_back(std::move(name));
  return tags;
}

void prune_old_tags(const std::string& save_dir, int keep_last) {
  if (keep_last < 1) checkpoint_fail(K::bad_argument, save_dir, ": prune_old_tags keep_last must be >= 1, got ", keep_last);
  std::string latest;
  try {
    latest = read_latest_tag(save_dir);
  } catch (const CheckpointError& e) {
    if (e.kind != K::missing_latest) throw;
  }
  std::vector<std::string> tags = list_tags(save_dir);
  int excess = int(tags.size()) - keep_last;
  for (int i = 0; i < excess; i++) {
    if (tags[size_t(i)] == latest) continue;
    std::string d = save_dir + "/" + tags[size_t(i)];
    // Drop the manifest first so a crash mid-delete leaves a directory no reader or listing treats as a tag.
    std::error_code ec;
    fs::remove(d + "/" + kManifest, ec);
    if (ec) checkpoint_fail(K::io, d, ": cannot remove manifest: ", ec.message());
    fsync_dir(d);
    fs::remove_all(d, ec);
    if (ec) checkpoint_fail(K::io, d, ": cannot remove: ", ec.message());
  }
  fsync_dir(save_dir);
}

}  // namespace dscpp
