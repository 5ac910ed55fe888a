// ProcessGroup: collectives over flat (contiguous) tensors among a fixed set of ranks, each returning a Work handle
// so communication can overlap compute. Backends: "gloo" (CPU tensors; Gloo's algorithms, one communication thread
// per group running the queued ops in order) and "nccl" (CUDA tensors; a communication stream per group, events).
// dtypes f32, bf16, f16, i32. avg needs a float dtype. On CPU, bf16/f16 reductions accumulate in f32.
//
// Failure behaviour: every op has the group's timeout. A timeout, a dead peer or a library error makes wait() throw
// dscpp::Error naming the op, the group, this rank and (when the store knows) the failed rank; the failing rank
// sets the store's abort key so the others stop promptly (Note [Store failure signalling], comm/store.h). After a
// failure the group is broken: every later op throws at once.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/comms_logger.h"
#include "dscpp/comm/store.h"
#include "dscpp/core/tensor.h"

namespace dscpp {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

enum class WorkStatus { pending, completed, failed };

// NCCL's CTA policy (ncclConfig_t::CTAPolicy, NCCL >= 2.28). zero: all_to_all and all_gather in this group's
// symmetric memory (alloc_symmetric) move their data with the GPU's copy engines, leaving every SM to the compute
// beside them (Note [All-reduce by copies]); on such a group those two and all_reduce_by_copies accept only that
// memory (Note [Copy-engine sources]). Such a group has a blocking communicator (NCCL 2.28.3 registers windows only
// on those).
enum class CtaPolicy { nccl_default, zero };

struct GroupOptions {  // how a new sub-group's collectives run; Gloo ignores it
  CtaPolicy cta_policy = CtaPolicy::nccl_default;
};

class Work {
 public:
  virtual ~Work() = default;
  // gloo: blocks until the op is done. nccl: makes the current compute stream wait for the op's end event; the host
  // does not block (barrier() excepted). When that is the stream current at launch, the op
  // stops holding its tensors: memory freed after wait() is reused only after the op (Note [Waited ops]). A tensor
  // allocated on another stream must be kept alive by the caller until that stream is done with it. Throws
  // dscpp::Error when the op failed.
  virtual void wait() = 0;
  virtual bool is_completed() = 0;  // non-blocking; true once finished, successfully or not
  virtual WorkStatus status() = 0;   // non-blocking
};
using WorkPtr = std::shared_ptr<Work>;

class ProcessGroup {
 public:
  // A group destroyed by stack unwinding means this rank is failing: it sets the store's abort key, so that its
  // peers stop instead of waiting out the timeout, and NCCL aborts the communicator rather than finish queued ops.
  // Catching an exception past a group's scope therefore ends the job.
  virtual ~ProcessGroup();
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }          // "world", "world/sub0", ...
  virtual const char* backend() const = 0;                    // "gloo" or "nccl"
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<TcpStore>& store() const { return store_.store; }
  int global_rank(int group_rank) const { return global_ranks_.at(size_t(group_rank)); }  // rank in the world

  // In place on `t`; avg divides the sum by size().
  WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);
  // in: size() * n elements; out: n elements, the reduction of every rank's block rank().
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
  // in: n elements; out: size() * n elements, block r = rank r's in.
  WorkPtr all_gather(Tensor& out, const Tensor& in);
  // in and out: size() * n elements; out's block r = rank r's block rank() of in.
  WorkPtr all_to_all(Tensor& out, const Tensor& in);
  // Note [All-reduce by copies]: an all-reduce of t (size() * n elements, op sum or avg) as an all_to_all of t into
  // scratch (>= t.numel() elements, t's dtype), a local sum of the size() blocks received into t's block rank()
  // (ops::sum_blocks, f32 accumulation) and an in-place all_gather. The same bytes cross the links as in a ring
  // all-reduce, but the only SM work is the local sum (t's bytes read once): with t and scratch from
  // alloc_symmetric on a group made with CtaPolicy::zero, NCCL moves the data with copy engines, so an overlapped
  // reduction no longer takes SMs from the backward GEMMs beside it. nccl: one op on the group's stream; gloo: the
  // same three steps on the host. Keep scratch alive and unused until the returned op is waited on.
  WorkPtr all_reduce_by_copies(Tensor& t, Tensor& scratch, ReduceOp op = ReduceOp::avg);
  // The first half of that: a reduce_scatter (in: size() * n elements, out: n, op sum or avg) as an all_to_all of
  // in into scratch (>= in.numel() elements) and ops::sum_blocks into out. On a CtaPolicy::zero group, in and
  // scratch must come from alloc_symmetric; out may be any memory of the device. Keep scratch alive and unused until
  // the returned op is waited on.
  WorkPtr reduce_scatter_by_copies(Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op = ReduceOp::avg);
  // A collective (every rank, the same numel and dtype, in the same order): zeroed memory that this group's
  // collectives can treat symmetrically. nccl: ncclMemAlloc'd and registered as a symmetric window of the group's
  // communicator (counted by the device allocator's statistics under the current memory category), deregistered
  // and freed when the last view goes, on every rank in the same order; memory that outlives the group is only
  // freed (Note [Symmetric memory]). gloo: ordinary CPU memory.
  Tensor alloc_symmetric(int64_t numel, DType dtype);
  WorkPtr broadcast(Tensor& t, int root);  // root is a rank of this group

  // Note [Collectives in CUDA graphs]
  // The ops above each make a Work with events the watchdog polls, and a CUDA graph cannot hold that (an event last
  // recorded under capture cannot be queried). These two run on the caller's current stream instead and return
  // nothing: the result is ready for whatever that stream runs next, and a graph may capture them (the
  // tensor-parallel decode step does). gloo: the op, waited for. nccl: an op enqueued outside a capture is watched
  // like any other (its timeout, an abort); a graph's are not until it is replayed and watch_stream called.
  void all_reduce_on_stream(Tensor& t, ReduceOp op = ReduceOp::sum);
  void all_gather_on_stream(Tensor& out, const Tensor& in);
  // nccl: the watchdog watches the work queued so far on the current stream as one op of this group named `what`
  // (a replayed graph's collectives): a dead peer (the store's abort key) or the timeout aborts the communicator, so
  // a later synchronisation fails instead of hanging. Not during a capture. gloo: nothing.
  void watch_stream(const char* what);
  WorkPtr barrier();
  WorkPtr send(const Tensor& t, int dst);  // matched in order with dst's recv(…, src = this rank)
  WorkPtr recv(Tensor& t, int src);

  // Collective over this group: every member calls it with the same sorted ranks (of this group), in the same order
  // as its other new_subgroup calls. Returns the sub-group on members, nullptr on the others.
  std::unique_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks, const GroupOptions& options = {});

  // Ops finished from now on are recorded (when the logger is enabled); sub-groups made later share it.
  void set_comms_logger(std::shared_ptr<CommsLogger> logger) { logger_ = std::move(logger); }
  const std::shared_ptr<CommsLogger>& comms_logger() const { return logger_; }

  // Marks the job as failed by this rank (first writer wins), so other ranks' waits stop. Never throws.
  void abort(const std::string& reason);

  // Used by the backends (public so their Work classes can call them).
  // "all_reduce on group 'world' (rank 0 of 2, gloo) failed (op #7 on this group): <what>[; failed rank: <abort
  // key>]"; also sets the abort key when no other rank did. seq 0 leaves the number out.
  // Note [Op numbers]: every collective a rank issues on a group gets the next number (1, 2, ...), as PyTorch's
  // SeqNum. Ranks issue the same collectives in the same order, so each op has the same number everywhere: a hang
  // whose ranks report different numbers, or different ops under one number, is a program that diverged between
  // ranks. send/recv, which ranks issue differently by design, are not numbered.
  [[noreturn]] void fail_op(const std::string& op, const std::string& what, uint64_t seq = 0);
  void log_op(const std::string& op, size_t bytes, double seconds);  // to the comms logger, if any

 protected:
  ProcessGroup(std::string name, int rank, int size, std::vector<int> global_ranks, StoreHandle store,
               std::chrono::milliseconds timeout);
  virtual WorkPtr do_all_reduce(Tensor& t, ReduceOp op) = 0;
  virtual WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual WorkPtr do_all_gather(Tensor& out, const Tensor& in) = 0;
  virtual WorkPtr do_all_to_all(Tensor& out, const Tensor& in) = 0;
  // The default composes do_all_to_all, ops::sum_blocks and do_all_gather, waiting for the first on the caller's
  // side (gloo: the host blocks; nccl overrides it with one op on its stream).
  virtual WorkPtr do_all_reduce_by_copies(Tensor& t, Tensor& scratch, ReduceOp op);
  virtual WorkPtr do_reduce_scatter_by_copies(Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op);
  virtual Tensor do_alloc_symmetric(int64_t numel, DType dtype) = 0;
  virtual WorkPtr do_broadcast(Tensor& t, int root) = 0;
  virtual void do_all_reduce_on_stream(Tensor& t, ReduceOp op) { do_all_reduce(t, op)->wait(); }
  virtual void do_all_gather_on_stream(Tensor& out, const Tensor& in) { do_all_gather(out, in)->wait(); }
  virtual void do_watch_stream(const char*) {}
  virtual WorkPtr do_barrier() = 0;
  virtual WorkPtr do_send(const Tensor& t, int dst) = 0;
  virtual WorkPtr do_recv(Tensor& t, int src) = 0;
  // Members only: a group of the same backend named `name` over `ranks` (ranks of this group), my rank `sub_rank`.
  virtual std::unique_ptr<ProcessGroup> make_subgroup(const std::string& name, int sub_rank,
                                                      const std::vector<int>& ranks, const GroupOptions& options) = 0;
  void check_tensor(const char* op, const Tensor& t) const;  // defined, dtype and device this backend handles
  uint64_t next_op_seq() { return ++ops_issued_; }           // Note [Op numbers]
  virtual bool device_ok(const Tensor& t) const = 0;

  std::string name_;
  int rank_, size_;
  std::vector<int> global_ranks_;
  StoreHandle store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CommsLogger> logger_;
  int subgroups_made_ = 0;
  std::string broken_;  // set by fail_op: later ops throw with it
  std::atomic<uint64_t> ops_issued_{0};
};

// The world group from the environment (comm/dist_env.h). backend "gloo", "nccl" or "auto" (nccl when this build has
// it and a GPU is present, else gloo). timeout 0 = default_comm_timeout() (DEEPSPEED_TIMEOUT). Rank 0 hosts the
// store on MASTER_PORT. Under nccl the current device is LOCAL_RANK % device count.
std::unique_ptr<ProcessGroup> init_process_group(const std::string& backend = "auto",
                                                 std::chrono::milliseconds timeout = {});
// The same from explicit values (tests, tools): rank 0 hosts the store on `port` for job `run_id`.
std::unique_ptr<ProcessGroup> new_process_group(const std::string& backend, int rank, int size,
                                                const std::string& master_addr, int port,
                                                std::chrono::milliseconds timeout, const std::string& run_id = "");
bool gloo_available();  // this build has the Gloo backend
bool nccl_available();  // this build has the NCCL backend

// A few host values all-reduced among the group (loss, tokens/s for printing) through a tensor on `device` (nccl
// needs CUDA memory, gloo CPU memory). A collective: every rank calls it with the same count.
std::vector<float> all_reduce_values(ProcessGroup& pg, const std::vector<float>& values, ReduceOp op, Device device);

// Note [Start-up agreement]
// Before its first collective, an engine has every rank post the settings that decide which collectives run and on
// what sizes (the DeepSpeed config key by key, the model's shape and dtype, the trainer's flags) and compares each
// rank's with rank 0's. A difference is named by key with both values ("rank 1 has dscpp.fused_head=true, rank 0
// false"), in the same words on every rank, where it would otherwise surface as a hang or as Gloo aborting inside
// the first collective whose sizes differ. Keys are the user's words: config key paths, `model.<field>`, `--flag`.
using Settings = std::vector<std::pair<std::string, std::string>>;  // (key, value as text), in a fixed order

// Throws dscpp::Error naming the first difference (on every rank; sets the abort key). Each call on a group uses
// fresh store keys (Note [Config checks per group]).
void check_same_settings(ProcessGroup& pg, TcpStore& store, const Settings& settings);

}  // namespace dscpp
