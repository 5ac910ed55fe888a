// Multi-rank checkpoint saves: every rank of a job writes its own files into the same "<save_dir>/<tag>.tmp" (a
// shared file system) at once, and the tag becomes visible only after every rank has written and fsynced its files.
// Ranks meet through the TcpStore, not through collectives, so a save can run from a background thread
// (async_checkpointer.h). The manifest is CheckpointWriter's plus "world_size" and, per file, the writing "rank".
// Note [Multi-rank commit] in src/checkpoint/sharded_writer.cpp gives the protocol and its failure cases.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/checkpoint_io.h"

namespace dscpp {

class AtomicDir;
class TcpStore;

// The ranks that save one checkpoint together. world_size 1 (store may be null): a single-process save with
// CheckpointWriter's protocol and no waiting.
struct SaveGroup {
  std::shared_ptr<TcpStore> store;       // every rank's client of the job's store (ProcessGroup::store())
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};  // how long to wait for the other ranks; 0 = the store's timeout
};

struct SaveStats {
  uint64_t bytes = 0;      // this rank's data files
  double seconds = 0;      // this rank's time writing + fsyncing them
  double commit_seconds = 0;  // waiting for the other ranks, manifest, rename, `latest` (and prune on rank 0)
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
  // Rank 0 after commit: every rank's bytes and write seconds, by rank (from their reports).
  std::vector<uint64_t> rank_bytes;
  std::vector<double> rank_seconds;
};

// One rank's part of one save. Every rank of the group constructs one with the same save_dir and tag, in the same
// order as its other saves (the store keys carry a per-rank save count, so they must agree). Throws
// CheckpointError: peer_failed (another rank failed, died or timed out; the message names it), io, bad_argument.
class ShardedWriter {
 public:
  // Rank 0 creates "<tag>.tmp" (removing a stale one) and announces it; the others wait for that.
  ShardedWriter(std::string save_dir, std::string tag, SaveGroup group = {});
  ~ShardedWriter();  // not committed: tells the other ranks this rank gave up; rank 0 removes "<tag>.tmp"
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;

  // File names are unique across ranks (e.g. "zero/rank_<r>.safetensors"). Device tensors are staged to the host.
  void add_tensors(const std::string& file_name, const NamedTensors& tensors, const StringMap& metadata = {});
  void add_json(const std::string& file_name, const nlohmann::json& j);
  // Rank > 0: reports its files and waits for rank 0's "committed". Rank 0: waits for every rank's files, writes
  // the manifest, renames, rewrites `latest` (update_latest), publishes "committed", then keeps the newest
  // keep_last tags (0 = all). Returns once the tag is visible on every path; throws if it will never be.
  void commit(bool update_latest = true, int keep_last = 0);

  const std::string& tag() const { return tag_; }
  const std::vector<FileRecord>& files() const { return files_; }  // this rank's
  const SaveStats& stats() const { return stats_; }

 private:
  template <typename Fn> void guarded(Fn&& fn);   // runs fn; on failure tells the others, then rethrows
  std::string begin_file(const std::string& file_name);
  std::string where() const;                      // "<save_dir>/<tag>.tmp (rank r of W)", for messages
  // Sets this save's abort key (first writer wins); returns the earlier value when another rank failed first.
  std::optional<std::string> fail_peers(const std::string& reason);
  void commit_rank0(bool update_latest, int keep_last);
  void commit_other();
  void say_quiet();                      // rank > 0: writes nothing more into "<tag>.tmp"
  void await_peers_quiet() noexcept;     // rank 0, failing: until every rank said so (or the timeout)

  std::string save_dir_, tag_, tmp_, ns_;  // ns_: this save's store key prefix
  SaveGroup g_;
  std::unique_ptr<AtomicDir> dir_;         // rank 0 only
  std::vector<FileRecord> files_;
  SaveStats stats_;
  bool done_ = false;                      // committed or failure already reported
};

// Multi-rank loading checks. A manifest without "world_size" (CheckpointWriter) counts as world size 1.
int checkpoint_world_size(const CheckpointReader& r);
// Throws CheckpointError(mismatch) naming the manifest when it was written by a different world size.
void check_checkpoint_world_size(const CheckpointReader& r, int world_size);
// The files `rank` wrote, sorted by name (rank 0 also gets files of a manifest without ranks).
std::vector<std::string> checkpoint_files_of_rank(const CheckpointReader& r, int rank);

}  // namespace dscpp
