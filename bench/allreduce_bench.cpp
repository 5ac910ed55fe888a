// All-reduce bandwidth of our NCCL ProcessGroup, reported as nccl-tests do (doc/PERFORMANCE.md there): for a buffer
// of S bytes taking t seconds, algbw = S / t and busbw = algbw * 2(n-1)/n (n ranks), GB/s = 1e9 B/s.
// One process per GPU, started by a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT:
//   dscpp launch --num_gpus 4 -- build/bench/allreduce_bench [--min-mib 1] [--max-mib 1024] [--factor 4]
//                                [--dtypes bf16,f32] [--warmup 5] [--iters 0] [--copies]
// --copies: all_reduce_by_copies (Note [All-reduce by copies]) on a CtaPolicy::zero group's symmetric memory, i.e.
// NCCL's copy-engine all_to_all and all_gather plus one local sum kernel; impl "dscpp-copies".
// --peer: the small all-reduces of tensor-parallel decode instead: NCCL enqueued on the compute stream (what the
// forward does, impl "nccl-stream") against our one-shot / two-shot kernel over peer memory (comm/peer_all_reduce.h,
// impl "dscpp-peer"); sizes in KiB with --min-kib 4 --max-kib 1024 --factor 2. --graph: each measurement is one CUDA
// graph of `iters` calls (as a decode step replays them: no launch cost), impl names end in "-graph".
// bench/allreduce_torch.py is the torch.distributed twin (same sizes, same timing). Rank 0 prints one tab-separated
// line per (dtype, size), prefixed RESULT:
//   RESULT impl op dtype world bytes time_us algbw_GBps busbw_GBps
// Timing: after --warmup ops, `iters` all_reduce (sum) calls are issued back to back (one communication stream runs
// them in order) between two device synchronisations; time = elapsed / iters, the slowest rank's. --iters 0 picks
// 20..200 by size (about 4 GiB moved per measurement). Before timing, a buffer of rank+1 must sum to n(n+1)/2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/peer_all_reduce.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/cuda_graph.h"

#include "bench_flags.h"

using namespace dscpp;

namespace {

struct Args {
  int64_t min_mib = 1, max_mib = 1024, factor = 4, warmup = 5, iters = 0, min_kib = 0, max_kib = 0;
  bool copies = false, peer = false, graph = false;
  std::vector<DType> dtypes{DType::bf16, DType::f32};
};

const bench::Flags kFlags{"allreduce_bench",
                          "allreduce_bench [--min-mib 1] [--max-mib 1024] [--factor 4]\n"
                          "                       [--dtypes bf16,f32] [--warmup 5] [--iters 0 (auto)] [--copies]\n"
                          "                       [--peer [--graph] --min-kib 4 --max-kib 1024 --factor 2]\n"
                          "run one process per GPU: dscpp launch --num_gpus N -- allreduce_bench ...\n"};
[[noreturn]] void usage(const std::string& why) { kFlags.fail(why); }

Args parse(int argc, char** argv) {
  Args a;
  const auto on_switch = [&](const std::string& k) {
    (k == "copies" ? a.copies : k == "peer" ? a.peer : a.graph) = true;
  };
  kFlags.parse(argc, argv, {"copies", "peer", "graph"}, on_switch, [&](const std::string& k, const std::string& v) {
    if (k == "min-mib") a.min_mib = kFlags.to_int(k, v, 1);
    else if (k == "min-kib") a.min_kib = kFlags.to_int(k, v, 1);
    else if (k == "max-kib") a.max_kib = kFlags.to_int(k, v, 1);
    else if (k == "max-mib") a.max_mib = kFlags.to_int(k, v, 1);
    else if (k == "factor") a.factor = kFlags.to_int(k, v, 2);
    else if (k == "warmup") a.warmup = kFlags.to_int(k, v, 0);
    else if (k == "iters") a.iters = kFlags.to_int(k, v, 0);
    else if (k == "dtypes") {
      a.dtypes.clear();
      for (const std::string& d : bench::Flags::list(v)) {
        if (d == "bf16") a.dtypes.push_back(DType::bf16);
        else if (d == "f32") a.dtypes.push_back(DType::f32);
        else if (d == "f16") a.dtypes.push_back(DType::f16);
        else usage("--dtypes: unknown dtype '" + d + "' (bf16, f32, f16)");
      }
    } else usage("unknown option --" + k);
  });
  if (a.max_mib < a.min_mib) usage("--max-mib is below --min-mib");
  if ((a.min_kib > 0) != (a.max_kib > 0) || a.max_kib < a.min_kib) usage("give --min-kib and --max-kib, in order");
  if (a.graph && !a.peer) usage("--graph times the --peer comparison");
  if (a.peer && a.copies) usage("--peer and --copies are separate comparisons");
  return a;
}

using Reduce = std::function<WorkPtr(Tensor&)>;
using OnStream = std::function<void(Tensor&)>;  // enqueued on the current stream, nothing returned

// Checks the sum of a buffer of rank+1 (exact in every dtype for small n): n(n+1)/2 everywhere.
void check_sum(ProcessGroup& pg, Tensor& buf, const OnStream& reduce) {
  const int n = pg.size();
  buf.fill(float(pg.rank() + 1));
  reduce(buf);
  Tensor host = buf.to(Device::cpu()).to(DType::f32);
  const float want = float(n * (n + 1) / 2);
  const float* p = host.data<float>();
  const int64_t m = host.numel();
  for (int64_t i : {int64_t(0), m / 3, m / 2, m - 1})
    if (p[i] != want) {
      std::fprintf(stderr, "allreduce_bench: rank %d: element %lld of the sum is %g, expected %g\n", pg.rank(),
                   (long long)i, double(p[i]), double(want));
      std::exit(1);
    }
}

// The slowest rank's microseconds per call of `op` on t: `iters` calls back to back on the compute stream, or one
// CUDA graph of them (`graph`), after warm-up; between two device synchronisations.
double time_on_stream(ProcessGroup& pg, const OnStream& op, Tensor& t, int64_t iters, int64_t warmup, bool graph,
                      int dev) {
  for (int64_t i = 0; i < warmup; i++) op(t);
  CudaGraph g;
  if (graph) {
    g.capture(dev, [&] {
      for (int64_t i = 0; i < iters; i++) op(t);
    });
    g.replay();  // uploads the graph
  }
  cuda_synchronize(dev);
  pg.barrier()->wait();  // blocks the host until every rank got here
  const auto t0 = std::chrono::steady_clock::now();
  if (graph) g.replay();
  else
    for (int64_t i = 0; i < iters; i++) op(t);
  cuda_synchronize(dev);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / double(iters);
  return all_reduce_values(pg, {float(us)}, ReduceOp::max, Device::cuda(dev))[0];
}

// --peer: NCCL on the stream against PeerAllReduce, for KiB sizes.
void compare_peer(const Args& a, ProcessGroup& pg, int dev) {
  const int n = pg.size();
  const int64_t min_b = (a.min_kib > 0 ? a.min_kib : 4) << 10, max_b = (a.max_kib > 0 ? a.max_kib : 1024) << 10;
  std::string why;
  std::unique_ptr<PeerAllReduce> peer = PeerAllReduce::create(pg, max_b, &why);
  if (!peer) throw Error("--peer: no peer all-reduce on these GPUs: " + why);
  const std::vector<std::pair<std::string, OnStream>> impls{
      {"nccl-stream", [&](Tensor& t) { pg.all_reduce_on_stream(t); }},
      {"dscpp-peer", [&](Tensor& t) { peer->all_reduce(t); }}};
  for (DType dt : a.dtypes) {
    Tensor buf = Tensor::empty({max_b / int64_t(dtype_size(dt))}, dt, Device::cuda(dev));
    for (const auto& [name, op] : impls) check_sum(pg, buf, op);
    for (int64_t bytes = min_b; bytes <= max_b; bytes *= a.factor) {
      Tensor t = buf.slice(0, bytes / int64_t(dtype_size(dt)));
      const int64_t iters = a.iters > 0 ? a.iters : 200;
      for (const auto& [name, op] : impls) {
        const double us = time_on_stream(pg, op, t, iters, std::max<int64_t>(a.warmup, 1), a.graph, dev);
        const double algbw = double(bytes) / (us * 1e-6) / 1e9;
        if (pg.rank() == 0) {
          std::printf("RESULT\t%s%s\tall_reduce\t%s\t%d\t%lld\t%.2f\t%.2f\t%.2f\n", name.c_str(),
                      a.graph ? "-graph" : "", dtype_name(dt), n, (long long)bytes, us, algbw,
                      algbw * 2.0 * double(n - 1) / double(n));
          std::fflush(stdout);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!cuda_available() || !nccl_available()) {
    std::fprintf(stderr, "allreduce_bench: needs a CUDA build with NCCL and a GPU\n");
    return 1;
  }
  try {
    const DistEnv env = read_dist_env();
    auto pg = init_process_group("nccl");  // the current device becomes LOCAL_RANK % device count
    const int n = pg->size(), rank = pg->rank();
    const int dev = env.local_rank % cuda_device_count();
    const Device device = Device::cuda(dev);
    if (rank == 0)
      std::fprintf(stderr, "allreduce_bench: %d ranks on %s, %lld..%lld MiB x%lld, warm-up %lld\n", n,
                   cuda_device_name(dev).c_str(), (long long)a.min_mib, (long long)a.max_mib, (long long)a.factor,
                   (long long)a.warmup);
    const double bus_factor = 2.0 * double(n - 1) / double(n);
    if (a.peer) {
      compare_peer(a, *pg, dev);
      pg->barrier()->wait();
      return 0;
    }
    std::unique_ptr<ProcessGroup> ce;
    if (a.copies) {
      std::vector<int> everyone;
      for (int r = 0; r < n; r++) everyone.push_back(r);
      GroupOptions zero;
      zero.cta_policy = CtaPolicy::zero;
      ce = pg->new_subgroup(everyone, zero);
    }
    for (DType dt : a.dtypes) {
      const int64_t max_bytes = a.max_mib << 20, max_numel = max_bytes / int64_t(dtype_size(dt));
      Tensor buf = ce ? ce->alloc_symmetric(max_numel, dt) : Tensor::empty({max_numel}, dt, device);
      Tensor scratch = ce ? ce->alloc_symmetric(max_numel, dt) : Tensor();
      const Reduce reduce = [&](Tensor& t) {
        return ce ? ce->all_reduce_by_copies(t, scratch, ReduceOp::sum) : pg->all_reduce(t);
      };
      check_sum(*pg, buf, [&](Tensor& t) { reduce(t)->wait(); });
      for (int64_t mib = a.min_mib; mib <= a.max_mib; mib *= a.factor) {
        const int64_t bytes = mib << 20, numel = bytes / int64_t(dtype_size(dt));
        Tensor t = buf.slice(0, numel);
        const int64_t iters = a.iters > 0 ? a.iters : std::clamp<int64_t>((int64_t(4) << 30) / bytes, 20, 200);
        WorkPtr w;
        for (int64_t i = 0; i < a.warmup; i++) w = reduce(t);
        if (w) w->wait();
        pg->barrier()->wait();  // blocks the host until every rank got here
        cuda_synchronize(dev);
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; i++) w = reduce(t);
        w->wait();  // the compute stream waits for the last op; one stream ran them in order
        cuda_synchronize(dev);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                    double(iters);
        us = all_reduce_values(*pg, {float(us)}, ReduceOp::max, device)[0];
        const double algbw = double(bytes) / (us * 1e-6) / 1e9;
        if (rank == 0) {
          std::printf("RESULT\t%s\tall_reduce\t%s\t%d\t%lld\t%.1f\t%.1f\t%.1f\n", ce ? "dscpp-copies" : "dscpp",
                      dtype_name(dt), n, (long long)bytes, us, algbw, algbw * bus_factor);
          std::fflush(stdout);
        }
      }
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
