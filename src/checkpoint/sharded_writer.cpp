// Multi-rank checkpoint saves (sharded_writer.h).
//
// Note [Multi-rank commit]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Note [Commit protocol] (checkpoint_io.cpp) with W writers. Store keys live under
// ns = "dscpp/ckpt/<tag>/<seq>", seq = this rank's count of saves of <tag> (store.add on a per-rank counter, so every
// rank derives the same seq without a round of messages, and a re-save of a tag never sees an old save's keys).
//   1. rank 0 removes a stale "<tag>.tmp", creates it, sets ns/ready; ranks > 0 wait for ns/ready
//   2. every rank streams its files into "<tag>.tmp" (each fsynced, CRC32 while writing)  [before_shard_write]
//   3. rank r > 0 sets ns/files/<r> = its FileRecords and write stats              [before_shard_report]
//   4. rank 0 waits for every ns/files/<r>, writes manifest.json (all ranks' files)   [before_manifest]
//      fsyncs the tree, renames "<tag>.tmp" -> "<tag>"                                  [before_rename]
//      rewrites `latest`                                                                [before_latest]
//      sets ns/committed, then prunes to keep_last; ranks > 0 return when they see ns/committed
// A rank > 0 sets ns/quiet/<r> once it writes nothing more into "<tag>.tmp" (step 3, or on failure); rank 0, failing,
// waits for those (at most the timeout) before it removes "<tag>.tmp", which a late file would otherwise keep alive.
// Failure: a rank whose step throws (or whose writer is destroyed uncommitted) sets ns/abort = "rank R: reason"
// (first writer wins, so it names the root cause) and rethrows. Every wait polls ns/abort and the job's abort key,
// which the store server sets when a rank's process dies (Note [Store failure signalling], comm/store.h); a
// lost store connection means rank 0 (the host) died. So every survivor throws CheckpointError(peer_failed)
// naming the failed rank promptly, or after the group's timeout when a rank hangs. Rank 0 never renames before it
// holds every rank's report, so nothing becomes visible and `latest` keeps naming the previous tag; a rank 0
// that fails removes "<tag>.tmp" (a crashed one leaves it for the next writer of the tag to remove).
// The save's abort key is not the job's: a failed checkpoint leaves the process group usable; the caller decides.
#include "dscpp/checkpoint/sharded_writer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "checkpoint/atomic_file.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/comm/store.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
using Clock = std::chrono::steady_clock;
constexpr const char* kManifest = "manifest.json";
constexpr size_t kWriteBlock = size_t(32) << 20;  // large writes: one syscall per 32 MiB

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

void check_tag(const std::string& tag) {
  bool bad = tag.empty() || tag == "." || tag == ".." || tag == "latest" || tag.find('/') != std::string::npos ||
             tag.find('\0') != std::string::npos || tag.ends_with(".tmp") || tag.ends_with(".old");
  if (bad) checkpoint_fail(K::bad_argument, "invalid checkpoint tag \"", tag, "\"");
}

void check_file_name(const std::string& dir, const std::string& name) {
  bool bad = name.empty() || name == kManifest || name.front() == '/' || name.back() == '/';
  for (const auto& part : fs::path(name)) bad = bad || part == "." || part == ".." || part.empty();
  if (bad) checkpoint_fail(K::bad_argument, dir, ": invalid file name \"", name, "\"");
}

// safetensors bytes exactly as write_safetensors lays them out, in kWriteBlock writes.
void write_tensors_blocked(FileWriter& out, const NamedTensors& tensors, const StringMap& metadata) {
  out.write(safetensors_header(tensors, metadata));
  for (const auto& [name, t] : tensors) {
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    const char* p = static_cast<const char*>(host.raw());
    for (size_t off = 0, n = host.nbytes(); off < n; off += kWriteBlock) out.write(p + off, std::min(kWriteBlock, n - off));
    checkpoint_fault_point(FaultPoint::after_tensor_write);
  }
}

nlohmann::json records_json(const std::vector<FileRecord>& files) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& f : files) a.push_back({f.name, f.bytes, f.crc32});
  return a;
}

nlohmann::json read_manifest(const CheckpointReader& r) {
  const std::string p = r.dir() + "/" + kManifest;
  std::ifstream f(p);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, p, ": invalid JSON: ", e.what());
  }
}
}  // namespace

// ---- waiting on the store ----

namespace {
// A store call; a lost connection means its host, rank 0, died.
template <typename Fn> auto via_store(const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    checkpoint_fail(K::peer_failed, where, ": rank 0: exited or failed (it hosts the store and the connection is lost): ", e.what());
  }
}

void put(TcpStore& s, const std::string& key, const std::string& value, const std::string& where) {
  via_store(where, [&] { s.set(key, value); });
}

// Polls until every key exists; throws CheckpointError(peer_failed) when the save (abort_key, unless empty) or the
// job is aborted, the store is gone, or `timeout` passes. `owners[i]` names the rank that owes keys[i] for the timeout message.
std::vector<Bytes> await_keys(TcpStore& s, const std::vector<std::string>& keys, const std::string& abort_key,
                              std::chrono::milliseconds timeout, const std::string& where,
                              const std::vector<int>& owners) {
  std::vector<Bytes> out(keys.size());
  std::vector<bool> have(keys.size(), false);
  auto deadline = Clock::now() + timeout;
  return via_store(where, [&] {
    for (int i = 0;; ++i) {
      bool all = true;
      for (size_t k = 0; k < keys.size(); ++k) {
        if (have[k]) continue;
        if (auto v = s.try_get(keys[k])) out[k] = std::move(*v), have[k] = true;
        else all = false;
      }
      if (all) return out;
      // The job's key first: when a rank dies, the survivor that notices first also aborts the save naming itself.
      if (auto why = s.abort_reason()) checkpoint_fail(K::peer_failed, where, ": job aborted: ", *why);
      if (auto why = abort_key.empty() ? std::nullopt : s.try_get(abort_key))
        checkpoint_fail(K::peer_failed, where, ": save abandoned: ", to_string(*why));
      if (Clock::now() >= deadline) {
        std::string late;
        for (size_t k = 0; k < keys.size(); ++k)
          if (!have[k]) late += (late.empty() ? "" : ", ") + std::to_string(owners[k]);
        checkpoint_fail(K::peer_failed, where, ": timed out after ", timeout.count(), " ms waiting for rank(s) ",
                        late);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(i < 50 ? 2 : 10));
    }
  });
}
}  // namespace

// ---- writer ----

ShardedWriter::ShardedWriter(std::string save_dir, std::string tag, SaveGroup group)
    : save_dir_(std::move(save_dir)), tag_(std::move(tag)), g_(std::move(group)) {
  check_tag(tag_);
  DSCPP_CHECK(g_.world_size >= 1 && g_.rank >= 0 && g_.rank < g_.world_size, "ShardedWriter: rank ", g_.rank,
              " of world size ", g_.world_size);
  DSCPP_CHECK(g_.world_size == 1 || g_.store, "ShardedWriter: world size ", g_.world_size, " needs a store");
  tmp_ = save_dir_ + "/" + tag_ + ".tmp";
  if (g_.store) {
    if (g_.timeout.count() <= 0) g_.timeout = g_.store->timeout();
    // Rank 0 may already have died in this save (a slow rank gets here late): say so by name.
    const std::string counter = "dscpp/ckpt/" + tag_ + "/saves/rank" + std::to_string(g_.rank);
    int64_t seq = via_store(where(), [&] { return g_.store->add(counter, 1); });
    ns_ = "dscpp/ckpt/" + tag_ + "/" + std::to_string(seq);
  }
  guarded([&] {
    if (g_.rank == 0) {
      std::error_code ec;
      fs::create_directories(save_dir_, ec);
      if (ec) checkpoint_fail(K::io, save_dir_, ": cannot create directory: ", ec.message());
      dir_ = std::make_unique<AtomicDir>(save_dir_ + "/" + tag_);
      if (g_.store) put(*g_.store, ns_ + "/ready", "ok", where());
    } else {
      await_keys(*g_.store, {ns_ + "/ready"}, ns_ + "/abort", g_.timeout, where(), {0});
    }
    checkpoint_fault_point(FaultPoint::before_shard_write);
  });
}

ShardedWriter::~ShardedWriter() {
  if (!done_) fail_peers("save abandoned before commit");
  if (dir_ && !dir_->committed()) await_peers_quiet();
}  // then dir_ removes "<tag>.tmp"

// Rank 0, giving up: the others may still be writing into "<tag>.tmp" (they learn of the abort only at their next
// wait), and a file created while remove_all walks the directory leaves it behind. So wait, at most the group's
// timeout, for every rank to say it writes no more; a dead job's ranks write nothing.
void ShardedWriter::await_peers_quiet() noexcept {
  if (!g_.store || g_.world_size == 1) return;
  std::vector<std::string> keys;
  std::vector<int> owners;
  for (int r = 1; r < g_.world_size; ++r) keys.push_back(ns_ + "/quiet/" + std::to_string(r)), owners.push_back(r);
  try {
    await_keys(*g_.store, keys, /*abort_key=*/"", g_.timeout, where(), owners);  // the save's abort is set: ignore it
  } catch (...) {  // runs on error paths: the store may be gone, the job aborted, a rank hung; remove what is there
  }
}

void ShardedWriter::say_quiet() {
  if (g_.store && g_.rank > 0) put(*g_.store, ns_ + "/quiet/" + std::to_string(g_.rank), "1", where());
}

std::optional<std::string> ShardedWriter::fail_peers(const std::string& reason) {
  done_ = true;
  if (!g_.store) return std::nullopt;
  try {
    say_quiet();
    std::string v = "rank " + std::to_string(g_.rank) + ": " + reason;
    if (g_.store->set_if_absent(ns_ + "/abort", Bytes(v.begin(), v.end()))) return std::nullopt;
    if (auto first = g_.store->try_get(ns_ + "/abort")) return to_string(*first);
  } catch (...) {  // runs on error paths: never hide the original error
  }
  return std::nullopt;
}

// A rank that fails because another one failed first (e.g. rank 0 removed "<tag>.tmp" under it) names that one.
template <typename Fn> void ShardedWriter::guarded(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    if (done_) throw;
    auto first = fail_peers(e.what());
    auto* ce = dynamic_cast<const CheckpointError*>(&e);
    if (!first || (ce && ce->kind == K::peer_failed)) throw;
    checkpoint_fail(K::peer_failed, where(), ": save abandoned: ", *first, " (here: ", e.what(), ")");
  }
}

std::string ShardedWriter::where() const {
  return tmp_ + " (rank " + std::to_string(g_.rank) + " of " + std::to_string(g_.world_size) + ")";
}

std::string ShardedWriter::begin_file(const std::string& file_name) {
  DSCPP_CHECK(!done_, tmp_, ": add after commit or failure");
  check_file_name(tmp_, file_name);
  for (const auto& r : files_)
    if (r.name == file_name) checkpoint_fail(K::bad_argument, tmp_, ": file ", file_name, " added twice");
  // Parents one level at a time below "<tag>.tmp" (other ranks may create the same ones: not an error), never
  // "<tag>.tmp" itself: if rank 0 gave up and removed it, this write fails rather than leave a stray directory.
  fs::path sub = tmp_;
  for (const auto& part : fs::path(file_name).parent_path()) {
    sub /= part;
    std::error_code ec;
    fs::create_directory(sub, ec);
    if (ec) checkpoint_fail(K::io, sub.string(), ": cannot create directory: ", ec.message());
  }
  return tmp_ + "/" + file_name;
}

void ShardedWriter::add_tensors(const std::string& file_name, const NamedTensors& tensors,
                                const StringMap& metadata) {
  guarded([&] {
    auto t0 = Clock::now();
    FileWriter out(begin_file(file_name));
    write_tensors_blocked(out, tensors, metadata);
    out.close_synced();
    files_.push_back({file_name, out.bytes(), out.crc32()});
    stats_.bytes += out.bytes();
    stats_.seconds += seconds_since(t0);
  });
}

void ShardedWriter::add_json(const std::string& file_name, const nlohmann::json& j) {
  guarded([&] {
    auto t0 = Clock::now();
    FileWriter out(begin_file(file_name));
    out.write(j.dump(2) + "\n");
    out.close_synced();
    files_.push_back({file_name, out.bytes(), out.crc32()});
    stats_.bytes += out.bytes();
    stats_.seconds += seconds_since(t0);
  });
}

void ShardedWriter::commit(bool update_latest, int keep_last) {
  DSCPP_CHECK(!done_, tmp_, ": committed twice (or after a failure)");
  auto t0 = Clock::now();
  guarded([&] {
    if (g_.rank == 0) commit_rank0(update_latest, keep_last);
    else commit_other();
  });
  stats_.commit_seconds = seconds_since(t0);
}

void ShardedWriter::commit_other() {
  checkpoint_fault_point(FaultPoint::before_shard_report);
  say_quiet();
  nlohmann::json rep = {{"files", records_json(files_)}, {"bytes", stats_.bytes}, {"seconds", stats_.seconds}};
  put(*g_.store, ns_ + "/files/" + std::to_string(g_.rank), rep.dump(), where());
  await_keys(*g_.store, {ns_ + "/committed"}, ns_ + "/abort", g_.timeout,
             where(), {0});
  done_ = true;
}

void ShardedWriter::commit_rank0(bool update_latest, int keep_last) {
  // Every rank's files, rank 0's first; the names must not collide across ranks.
  std::vector<std::pair<FileRecord, int>> all;
  for (const auto& f : files_) all.emplace_back(f, 0);
  stats_.rank_bytes.assign(size_t(g_.world_size), 0);
  stats_.rank_seconds.assign(size_t(g_.world_size), 0);
  stats_.rank_bytes[0] = stats_.bytes;
  stats_.rank_seconds[0] = stats_.seconds;
  if (g_.world_size > 1) {
    std::vector<std::string> keys;
    std::vector<int> owners;
    for (int r = 1; r < g_.world_size; ++r) keys.push_back(ns_ + "/files/" + std::to_string(r)), owners.push_back(r);
    std::vector<Bytes> reps = await_keys(*g_.store, keys, ns_ + "/abort", g_.timeout, where(), owners);
    for (int r = 1; r < g_.world_size; ++r) {
      nlohmann::json rep = nlohmann::json::parse(to_string(reps[size_t(r - 1)]));
      for (const auto& f : rep.at("files"))
        all.emplace_back(FileRecord{f[0].get<std::string>(), f[1].get<uint64_t>(), f[2].get<uint32_t>()}, r);
      stats_.rank_bytes[size_t(r)] = rep.at("bytes").get<uint64_t>();
      stats_.rank_seconds[size_t(r)] = rep.at("seconds").get<double>();
    }
  }
  checkpoint_fault_point(FaultPoint::before_manifest);
  nlohmann::ordered_json m;
  m["format"] = "dscpp-checkpoint";
  m["format_version"] = kCheckpointFormatVersion;
  m["tag"] = tag_;
  m["created_unix_ns"] =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  m["world_size"] = g_.world_size;
  m["files"] = nlohmann::ordered_json::object();
  for (const auto& [f, r] : all) {
    if (m["files"].contains(f.name))
      checkpoint_fail(K::bad_argument, tmp_, ": file ", f.name, " written by rank ", r, " and rank ",
                      m["files"][f.name]["rank"].get<int>());
    m["files"][f.name] = {{"bytes", f.bytes}, {"crc32", f.crc32}, {"rank", r}};
  }
  FileWriter out(tmp_ + "/" + kManifest);
  out.write(m.dump(2) + "\n");
  out.close_synced();

  dir_->sync();
  checkpoint_fault_point(FaultPoint::before_rename);
  dir_->rename_into_place();
  checkpoint_fault_point(FaultPoint::before_latest);
  if (update_latest) write_file_atomic(save_dir_ + "/latest", tag_);
  if (g_.store) put(*g_.store, ns_ + "/committed", "ok", where());
  done_ = true;  // from here a failure (pruning) is rank 0's alone: the tag is committed
  if (keep_last > 0) prune_old_tags(save_dir_, keep_last);
}

// ---- loading checks ----

int checkpoint_world_size(const CheckpointReader& r) {
  nlohmann::json m = read_manifest(r);
  if (!m.contains("world_size")) return 1;
  if (!m["world_size"].is_number_integer() || m["world_size"].get<int>() < 1)
    checkpoint_fail(K::bad_header, r.dir(), "/", kManifest, ": world_size must be a positive integer, got ",
                    m["world_size"].dump());
  return m["world_size"].get<int>();
}

void check_checkpoint_world_size(const CheckpointReader& r, int world_size) {
  int w = checkpoint_world_size(r);
  if (w != world_size)
    checkpoint_fail(K::mismatch, r.dir(), "/", kManifest, ": checkpoint was saved by ", w,
                    " ranks, this job has ", world_size,
                    " (ZeRO shards are per rank: convert it to a universal checkpoint to change the world size)");
}

std::vector<std::string> checkpoint_files_of_rank(const CheckpointReader& r, int rank) {
  nlohmann::json m = read_manifest(r);
  std::vector<std::string> out;
  for (const auto& [name, rec] : m.at("files").items())
    if (rec.value("rank", 0) == rank) out.push_back(name);
  return out;
}

}  // namespace dscpp
