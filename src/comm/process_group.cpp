// ProcessGroup's backend-independent half: argument checks, error messages and abort, sub-group bookkeeping,
// init_process_group from the environment, and the start-up agreement check (Note [Start-up agreement]).
#include "dscpp/comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "comm/process_group_impl.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/core/cuda.h"
#include "dscpp/kernels/ops.h"

namespace dscpp {

using namespace comm_detail;

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(std::string name, int rank, int size, std::vector<int> global_ranks, StoreHandle store,
                           std::chrono::milliseconds timeout)
    : name_(std::move(name)), rank_(rank), size_(size), global_ranks_(std::move(global_ranks)),
      store_(std::move(store)), timeout_(timeout) {
  if (global_ranks_.empty())
    for (int r = 0; r < size; ++r) global_ranks_.push_back(r);
  DSCPP_CHECK(int(global_ranks_.size()) == size_ && rank_ >= 0 && rank_ < size_, "ProcessGroup '", name_,
              "': rank ", rank_, " of ", size_, " with ", global_ranks_.size(), " global ranks");
}

ProcessGroup::~ProcessGroup() {
  // Dying by an exception (stack unwinding) means this rank failed: tell the others rather than let them time out.
  // The backends say so first, before they wait for their own threads (the first reason written stays).
  if (std::uncaught_exceptions() > 0) abort("exited with an exception");
}

void ProcessGroup::abort(const std::string& reason) {
  if (store_.store) store_.store->abort(global_rank(rank_), reason);
}

void ProcessGroup::fail_op(const std::string& op, const std::string& what, uint64_t seq) {
  std::string msg = op + " on group '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
                    std::to_string(size_) + ", " + backend() + ") failed" +
                    (seq ? " (op #" + std::to_string(seq) + " on this group)" : std::string()) + ": " + what;
  std::optional<std::string> why;
  if (store_.store) {
    // A peer's death reaches us through the library and the store at about the same time: give the store (whose
    // key names the root cause) a moment before blaming ourselves.
    for (int i = 0; i < 20 && !(why = store_.store->abort_reason()); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    if (!why) store_.store->abort(global_rank(rank_), msg);
    else msg += "; failed rank: " + *why;
  }
  if (broken_.empty()) broken_ = msg;
  throw Error(msg);
}

void ProcessGroup::log_op(const std::string& op, size_t bytes, double seconds) {
  if (logger_) logger_->record(op, bytes, size_, seconds);
}

void ProcessGroup::check_tensor(const char* op, const Tensor& t) const {
  DSCPP_CHECK(broken_.empty(), op, " on group '", name_, "': the group is broken by an earlier failure: ", broken_);
  DSCPP_CHECK(t.defined(), op, " on group '", name_, "': undefined tensor");
  DType d = t.dtype();
  DSCPP_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::i32, op, " on group '", name_,
              "': dtype ", dtype_name(d), " is not supported (f32, bf16, f16, i32)");
  DSCPP_CHECK(device_ok(t), op, " on group '", name_, "': ", backend(), " cannot use a tensor on ",
              t.device().str());
}

WorkPtr ProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t);
  DSCPP_CHECK(op != ReduceOp::avg || dtype_is_float(t.dtype()), "all_reduce avg needs a float dtype, got ",
              dtype_name(t.dtype()));
  return do_all_reduce(t, op);
}

WorkPtr ProcessGroup::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  check_tensor("reduce_scatter", out);
  check_tensor("reduce_scatter", in);
  DSCPP_CHECK(in.dtype() == out.dtype(), "reduce_scatter: dtypes differ (in ", dtype_name(in.dtype()), ", out ",
              dtype_name(out.dtype()), ")");
  DSCPP_CHECK(in.numel() == out.numel() * size_, "reduce_scatter on group '", name_, "': in has ", in.numel(),
              " elements, expected out's ", out.numel(), " x ", size_, " ranks");
  DSCPP_CHECK(op != ReduceOp::avg || dtype_is_float(in.dtype()), "reduce_scatter avg needs a float dtype");
  return do_reduce_scatter(out, in, op);
}

static void check_all_gather(const std::string& group, int size, const Tensor& out, const Tensor& in) {
  DSCPP_CHECK(in.dtype() == out.dtype(), "all_gather: dtypes differ (in ", dtype_name(in.dtype()), ", out ",
              dtype_name(out.dtype()), ")");
  DSCPP_CHECK(out.numel() == in.numel() * size, "all_gather on group '", group, "': out has ", out.numel(),
              " elements, expected in's ", in.numel(), " x ", size, " ranks");
}

WorkPtr ProcessGroup::all_gather(Tensor& out, const Tensor& in) {
  check_tensor("all_gather", out);
  check_tensor("all_gather", in);
  check_all_gather(name_, size_, out, in);
  return do_all_gather(out, in);
}

void ProcessGroup::all_reduce_on_stream(Tensor& t, ReduceOp op) {
  check_tensor("all_reduce_on_stream", t);
  DSCPP_CHECK(op != ReduceOp::avg || dtype_is_float(t.dtype()), "all_reduce_on_stream avg needs a float dtype, got ",
              dtype_name(t.dtype()));
  do_all_reduce_on_stream(t, op);
}

void ProcessGroup::all_gather_on_stream(Tensor& out, const Tensor& in) {
  check_tensor("all_gather_on_stream", out);
  check_tensor("all_gather_on_stream", in);
  check_all_gather(name_, size_, out, in);
  do_all_gather_on_stream(out, in);
}

void ProcessGroup::watch_stream(const char* what) {
  DSCPP_CHECK(broken_.empty(), what, " on group '", name_, "': the group is broken by an earlier failure: ", broken_);
  do_watch_stream(what);
}

WorkPtr ProcessGroup::all_to_all(Tensor& out, const Tensor& in) {
  check_tensor("all_to_all", out);
  check_tensor("all_to_all", in);
  DSCPP_CHECK(in.dtype() == out.dtype(), "all_to_all: dtypes differ (in ", dtype_name(in.dtype()), ", out ",
              dtype_name(out.dtype()), ")");
  DSCPP_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0, "all_to_all on group '", name_, "': in has ",
              in.numel(), " elements and out ", out.numel(), ", expected the same number, a multiple of ", size_,
              " ranks");
  return do_all_to_all(out, in);
}

namespace {
void check_by_copies(const char* op, const std::string& group, int size, ReduceOp rop, const Tensor& t,
                     const Tensor& scratch) {
  DSCPP_CHECK(rop == ReduceOp::sum || rop == ReduceOp::avg, op, ": op ", reduce_op_name(rop), " (expected sum or avg)");
  DSCPP_CHECK(dtype_is_float(t.dtype()) && scratch.dtype() == t.dtype(), op, ": the data is ", dtype_name(t.dtype()),
              " and scratch ", dtype_name(scratch.dtype()), " (expected one float dtype)");
  DSCPP_CHECK(t.numel() % size == 0 && scratch.numel() >= t.numel(), op, " on group '", group, "': the data has ",
              t.numel(), " elements (expected a multiple of ", size, " ranks), scratch ", scratch.numel(),
              " (expected >= the data's)");
}
float by_copies_scale(ReduceOp op, int size) { return op == ReduceOp::avg ? 1.0f / float(size) : 1.0f; }
}  // namespace

WorkPtr ProcessGroup::all_reduce_by_copies(Tensor& t, Tensor& scratch, ReduceOp op) {
  check_tensor("all_reduce_by_copies", t);
  check_tensor("all_reduce_by_copies", scratch);
  check_by_copies("all_reduce_by_copies", name_, size_, op, t, scratch);
  return do_all_reduce_by_copies(t, scratch, op);
}

WorkPtr ProcessGroup::reduce_scatter_by_copies(Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op) {
  check_tensor("reduce_scatter_by_copies", out);
  check_tensor("reduce_scatter_by_copies", in);
  check_tensor("reduce_scatter_by_copies", scratch);
  check_by_copies("reduce_scatter_by_copies", name_, size_, op, in, scratch);
  DSCPP_CHECK(out.dtype() == in.dtype() && out.numel() * size_ == in.numel(), "reduce_scatter_by_copies on group '",
              name_, "': out is ", out.str(), ", expected ", dtype_name(in.dtype()), " [", in.numel() / size_,
              "] (in's elements / ", size_, " ranks)");
  return do_reduce_scatter_by_copies(out, in, scratch, op);
}

// The defaults run the steps one after another, the host waiting for the all_to_all (gloo's ops are synchronous).
WorkPtr ProcessGroup::do_reduce_scatter_by_copies(Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op) {
  Tensor received = scratch.slice(0, in.numel());
  WorkPtr w = do_all_to_all(received, in);
  w->wait();
  ops::sum_blocks(out, received, by_copies_scale(op, size_));
  return w;
}

WorkPtr ProcessGroup::do_all_reduce_by_copies(Tensor& t, Tensor& scratch, ReduceOp op) {
  const int64_t n = t.numel() / size_;
  Tensor mine = t.slice(int64_t(rank_) * n, n);
  ProcessGroup::do_reduce_scatter_by_copies(mine, t, scratch, op);
  return do_all_gather(t, mine);
}

Tensor ProcessGroup::alloc_symmetric(int64_t numel, DType dtype) {
  DSCPP_CHECK(broken_.empty(), "alloc_symmetric on group '", name_, "': the group is broken by an earlier failure: ",
              broken_);
  DSCPP_CHECK(numel >= 1, "alloc_symmetric on group '", name_, "': ", numel, " elements (expected >= 1)");
  return do_alloc_symmetric(numel, dtype);
}

WorkPtr ProcessGroup::broadcast(Tensor& t, int root) {
  check_tensor("broadcast", t);
  DSCPP_CHECK(root >= 0 && root < size_, "broadcast on group '", name_, "': root ", root, " is not in [0, ", size_,
              ")");
  return do_broadcast(t, root);
}

WorkPtr ProcessGroup::barrier() {
  DSCPP_CHECK(broken_.empty(), "barrier on group '", name_, "': the group is broken by an earlier failure: ",
              broken_);
  return do_barrier();
}

WorkPtr ProcessGroup::send(const Tensor& t, int dst) {
  check_tensor("send", t);
  DSCPP_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send on group '", name_, "' from rank ", rank_, ": dst ",
              dst, " must be another rank of [0, ", size_, ")");
  return do_send(t, dst);
}

WorkPtr ProcessGroup::recv(Tensor& t, int src) {
  check_tensor("recv", t);
  DSCPP_CHECK(src >= 0 && src < size_ && src != rank_, "recv on group '", name_, "' at rank ", rank_, ": src ",
              src, " must be another rank of [0, ", size_, ")");
  return do_recv(t, src);
}

std::unique_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>& ranks, const GroupOptions& options) {
  DSCPP_CHECK(!ranks.empty(), "new_subgroup of '", name_, "': no ranks");
  for (size_t i = 0; i < ranks.size(); ++i)
    DSCPP_CHECK(ranks[i] >= 0 && ranks[i] < size_ && (i == 0 || ranks[i] > ranks[i - 1]), "new_subgroup of '",
                name_, "': ranks must be sorted, distinct and in [0, ", size_, "); rank ", ranks[i], " at index ", i,
                " is not");
  std::string sub_name = name_ + "/sub" + std::to_string(subgroups_made_++);
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  auto sub = make_subgroup(sub_name, int(it - ranks.begin()), ranks, options);
  sub->logger_ = logger_;
  return sub;
}

// ---------------------------------------------------------------------------------------------------------------

static std::unique_ptr<ProcessGroup> make_group(const std::string& backend, GroupArgs args) {
  if (backend == "gloo") return make_gloo_group(std::move(args));
  if (backend == "nccl") return make_nccl_group(std::move(args));
  DSCPP_FAIL("unknown communication backend '", backend, "' (gloo, nccl or auto)");
}

static std::string resolve_backend(const std::string& backend) {
  if (backend != "auto") return backend;
  return nccl_available() && cuda_available() ? "nccl" : "gloo";
}

std::unique_ptr<ProcessGroup> new_process_group(const std::string& backend, int rank, int size,
                                                const std::string& master_addr, int port,
                                                std::chrono::milliseconds timeout, const std::string& run_id) {
  if (timeout.count() <= 0) timeout = default_comm_timeout();
  DSCPP_CHECK(size >= 1 && rank >= 0 && rank < size, "new_process_group: rank ", rank, " of ", size);
  std::string be = resolve_backend(backend);
  if (be == "gloo" && !gloo_available())
    DSCPP_FAIL("the gloo backend is not in this build (install libgloo-dev: scripts/install-deps.sh, and reconfigure)");
  if (be == "nccl" && !nccl_available())
    DSCPP_FAIL("the nccl backend is not in this build (needs -DDSCPP_CUDA=ON and NCCL's nccl.h/libnccl)");
  GroupArgs a;
  a.name = "world";
  a.rank = rank;
  a.size = size;
  a.store = connect_store(master_addr, port, rank, rank == 0, timeout, run_id);
  a.timeout = timeout;
  // Every rank must agree on the world size: a stale launcher or a wrong WORLD_SIZE would otherwise hang.
  if (rank == 0) a.store.store->set("dscpp/world_size_0", std::to_string(size));
  std::string ws = a.store.store->get_string("dscpp/world_size_0", timeout);
  DSCPP_CHECK(ws == std::to_string(size), "rank ", rank, " was started with WORLD_SIZE=", size,
              " but rank 0 has WORLD_SIZE=", ws);
  return make_group(be, std::move(a));
}

std::unique_ptr<ProcessGroup> init_process_group(const std::string& backend, std::chrono::milliseconds timeout) {
  DistEnv e = read_dist_env();
  std::string be = resolve_backend(backend);
  if (be == "nccl") {
    int n = cuda_device_count();
    DSCPP_CHECK(n > 0, "init_process_group(nccl): no CUDA device");
    cuda_set_device(e.local_rank % n);
  }
  return new_process_group(be, e.rank, e.world_size, e.master_addr, e.master_port, timeout, e.run_id);
}

std::vector<float> all_reduce_values(ProcessGroup& pg, const std::vector<float>& values, ReduceOp op,
                                     Device device) {
  Tensor host = Tensor::empty({int64_t(values.size())}, DType::f32, Device::cpu());
  std::copy(values.begin(), values.end(), host.data<float>());
  Tensor t = device.is_cpu() ? host : host.to(device);
  pg.all_reduce(t, op)->wait();
  if (!device.is_cpu()) host = t.to(Device::cpu());  // nccl's wait only orders the stream; to() synchronises
  return std::vector<float>(host.data<float>(), host.data<float>() + values.size());
}

// Note [Config checks per group]: the n-th check this process makes on a group uses its own keys (.../<n>/<rank>).
// Every rank builds its engines in the same order, so the n-th checks of all ranks meet; a second engine on the same
// group never reads the hashes the first one left in the store.
static int next_config_check(const std::string& group) {
  static std::mutex mu;
  static std::map<std::string, int> count;
  std::lock_guard<std::mutex> lock(mu);
  return count[group]++;
}

static std::string encode_settings(const Settings& s) {
  std::string out;
  for (const auto& [k, v] : s) out += k + '\0' + v + '\0';
  return out;
}

static Settings decode_settings(const std::string& text) {
  Settings s;
  size_t p = 0;
  while (p < text.size()) {
    size_t k_end = text.find('\0', p), v_end = text.find('\0', k_end + 1);
    s.emplace_back(text.substr(p, k_end - p), text.substr(k_end + 1, v_end - k_end - 1));
    p = v_end + 1;
  }
  return s;
}

// "" when `other` agrees with `ref`, else the message naming the first key that differs and counting the rest.
static std::string settings_difference(const Settings& ref, const Settings& other, int other_rank) {
  std::map<std::string, std::string> ref_of(ref.begin(), ref.end()), other_of(other.begin(), other.end());
  std::vector<std::string> keys;  // differing keys, in the order `other` lists them, then those only rank 0 has
  std::string first;
  auto note = [&](const std::string& k, const std::string& mine, const std::string& theirs) {
    if (keys.empty())
      first = "rank " + std::to_string(other_rank) + " has " + k + "=" + mine + ", rank 0 " + theirs;
    keys.push_back(k);
  };
  for (const auto& [k, v] : other) {
    auto it = ref_of.find(k);
    if (it == ref_of.end()) note(k, v, "has no " + k);
    else if (it->second != v) note(k, v, it->second);
  }
  for (const auto& [k, v] : ref)
    if (!other_of.count(k)) note(k, "(none)", v);
  if (keys.empty()) return "";
  std::string msg = "ranks disagree at start-up: " + first;
  if (keys.size() > 1) {
    msg += "; also different:";
    for (size_t i = 1; i < keys.size() && i < 6; ++i) msg += (i > 1 ? ", " : " ") + keys[i];
    if (keys.size() > 6) msg += " and " + std::to_string(keys.size() - 6) + " more";
  }
  return msg + ". Every rank must run the same config, model and flags";
}

void check_same_settings(ProcessGroup& pg, TcpStore& store, const Settings& settings) {
  std::string base = "pg/" + pg.name() + "/settings/" + std::to_string(next_config_check(pg.name())) + "/";
  store.set(base + std::to_string(pg.rank()), encode_settings(settings));
  std::vector<std::string> keys;
  for (int r = 0; r < pg.size(); ++r) keys.push_back(base + std::to_string(r));
  store.wait(keys, pg.timeout());
  const Settings ref = decode_settings(store.get_string(keys[0]));
  for (int r = 1; r < pg.size(); ++r) {  // every rank reads every rank: all name the same (lowest) rank
    std::string msg = settings_difference(ref, decode_settings(store.get_string(keys[size_t(r)])), r);
    if (msg.empty()) continue;
    store.abort(pg.global_rank(pg.rank()), msg);
    throw Error(msg);
  }
}

}  // namespace dscpp
