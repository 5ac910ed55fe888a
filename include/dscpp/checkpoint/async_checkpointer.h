// Checkpoint saves as plans, written synchronously (save_checkpoint) or in the background (AsyncCheckpointer).
// A plan lists this rank's files; both paths write them through ShardedWriter (sharded_writer.h), so they produce
// byte-identical data files and manifests that differ only in created_unix_ns.
// Async: save() copies every tensor into host memory (pinned when the tensor is on a GPU, one synchronisation at
// the end), returns, and a background thread writes and commits. The caller may change its tensors as soon as
// save() returns. Training only stalls for the snapshot and for a previous save still in flight.
#pragma once
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/sharded_writer.h"

namespace dscpp {

// One file of a save: a safetensors file (tensors + metadata) or, when `json` is not null, a JSON document.
struct PlanFile {
  std::string name;  // relative to the tag directory, unique across ranks
  NamedTensors tensors;
  StringMap metadata;
  nlohmann::json json;
  static PlanFile tensors_file(std::string name, NamedTensors tensors, StringMap metadata = {});
  static PlanFile json_file(std::string name, nlohmann::json j);
};

struct SavePlan {
  std::string save_dir, tag;
  std::vector<PlanFile> files;  // this rank's files, written in this order
  bool update_latest = true;
  int keep_last = 0;            // rank 0 keeps the newest keep_last tags after the commit (0 = all)
};

// Writes and commits the plan now (every rank of `group` calls it with its own files). Returns this rank's stats.
SaveStats save_checkpoint(const SavePlan& plan, const SaveGroup& group = {});

struct AsyncSaveStats {
  double stall_seconds = 0;     // the caller's time in save(): wait_seconds + snapshot_seconds
  double wait_seconds = 0;      // waiting for the previous save to finish
  double snapshot_seconds = 0;  // copying tensors to host memory
  double write_seconds = 0;     // background: writing + fsyncing this rank's files
  double commit_seconds = 0;    // background: waiting for the other ranks, manifest, rename, `latest`, prune
  uint64_t bytes = 0;           // this rank's data files
  double gbps() const { return write_seconds > 0 ? double(bytes) / write_seconds / 1e9 : 0; }
  SaveStats save;               // the writer's stats (rank 0: every rank's bytes and seconds)
};

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(SaveGroup group = {});
  ~AsyncCheckpointer();  // waits for a save in flight; a failure nobody wait()ed for is printed to stderr

  // Waits for the previous save (rethrowing its failure), snapshots the plan's tensors and starts writing.
  void save(SavePlan plan);
  // Joins the save in flight; rethrows its failure (once). Returns at once when none is in flight.
  void wait();
  bool in_flight() const { return worker_.joinable(); }
  // The last save's stats; the write/commit fields are final once wait() has returned.
  const AsyncSaveStats& last_stats() const { return stats_; }

 private:
  void join_previous();  // join + rethrow without touching stats_

  SaveGroup group_;
  std::thread worker_;
  std::exception_ptr error_;
  AsyncSaveStats stats_;
};

// A host copy of every tensor of the plan (pinned host memory for device tensors). Exposed for tests.
SavePlan snapshot_plan(const SavePlan& plan);

}  // namespace dscpp
