// PeerAllReduce (comm/peer_all_reduce.h) on CUDA.
//
// Note [Peer all-reduce]
// Each rank cudaMallocs one region: a flag area, then two data buffers of max_bytes (A and B), and posts its CUDA
// IPC handle to the group's store; every rank opens every other's, so a kernel on rank r can load and store the
// peers' regions directly (over NVLink). One kernel per all-reduce, always kBlocks blocks of kThreads threads:
//   1. each block bumps its own call counter (the epoch, in device memory: a replayed CUDA graph counts too) and
//      copies its share of the input into this rank's buffer, A on odd epochs, B on even ones;
//   2. it meets block b of every rank at a barrier: it stores the epoch into slot [b][r] of every rank's flags
//      (release, system scope), then waits until slot [b][p] of its own flags holds the epoch for every rank p;
//   3. one-shot: it sums its share over every rank's buffer, in rank order in f32, into the output. Two-shot (more
//      than 2 ranks, 256 KiB or more): it sums only its share of chunk r (the r-th of R equal chunks) into chunk r of
//      its own buffer and the output, meets the peers at a second barrier, then copies the other chunks, already
//      reduced, from their owners' buffers.
// A block's share is a function of the message size and the block only, so block b of every rank writes what block
// b of the others reads: a barrier per block is enough, no grid-wide one. The data move through L2 (ld.global.cg),
// never through a stale L1 line.
// Why no barrier at the end: epoch e writes the buffer of epoch e - 2. Block b of rank r got past the barrier of
// epoch e - 1, so every peer had started its kernel of epoch e - 1, so its kernel of epoch e - 2, which read that
// buffer, had ended (kernels of one stream run one after another). Every block runs every call (a fixed grid), so
// all blocks agree on the epoch. Flags compare with != (epochs wrap): a peer cannot be a whole barrier ahead in
// the same slot, since passing it needs this rank's arrival.
// Failures: a block waiting for a dead peer would spin forever, so the wait also reads a word of pinned host memory
// that a monitor thread sets once the store's abort key appears (a peer died, Note [Store failure signalling]);
// the kernel then ends with garbage that nobody uses, as the group's next op reports the failure.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda/cuda_runtime.cuh"
#include "dscpp/comm/peer_all_reduce.h"
#include "dscpp/comm/process_group.h"

namespace dscpp {
namespace {

constexpr int kMaxRanks = 8, kBlocks = 32, kThreads = 512;
constexpr int64_t kTwoShotBytes = 256 << 10;
constexpr size_t kDataOffset = 4096;  // the data buffers start past the flags (2 kinds x kBlocks x kMaxRanks u32)
static_assert(2 * kBlocks * kMaxRanks * sizeof(uint32_t) <= kDataOffset, "the flags overlap buffer A");

struct Peers {
  char* region[kMaxRanks];        // every rank's region, mapped here: flags, then buffers A and B
  uint32_t* epoch;                // this rank's per-block call counters [kBlocks]
  const volatile int* abort;      // pinned host memory, set by the monitor thread
  int64_t max_bytes;
};

__device__ __forceinline__ uint32_t* flag(char* region, int kind, int block, int rank) {
  return reinterpret_cast<uint32_t*>(region) + (kind * kBlocks + block) * kMaxRanks + rank;
}

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b of this rank meets block b of every rank (Note [Peer all-reduce]).
template <int R>
__device__ void barrier(const Peers& p, int rank, int kind, uint32_t epoch) {
  __syncthreads();  // the block's writes happen before the flag's release
  if (threadIdx.x < R) {
    __threadfence_system();
    store_release(flag(p.region[threadIdx.x], kind, blockIdx.x, rank), epoch);
    const uint32_t* mine = flag(p.region[rank], kind, blockIdx.x, threadIdx.x);
    for (uint32_t spins = 0; load_acquire(mine) != epoch; spins++)
      if ((spins & 1023) == 1023 && *p.abort) break;
  }
  __syncthreads();
}

// Two 16-bit floats in 32 bits, as a float2 and back.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  __device__ static float2 to(uint32_t w) { return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(w)); }
  __device__ static uint32_t from(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return reinterpret_cast<const uint32_t&>(h);
  }
};
template <>
struct Pair<__half> {
  __device__ static float2 to(uint32_t w) { return __half22float2(reinterpret_cast<const __half2&>(w)); }
  __device__ static uint32_t from(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return reinterpret_cast<const uint32_t&>(h);
  }
};

// 16 bytes of T added into floats, and floats packed back into 16 bytes of T.
template <typename T>
struct Vec {
  static constexpr int n = 8;
  __device__ static void add(float* acc, const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 f = Pair<T>::to(w[i]);
      acc[2 * i] += f.x, acc[2 * i + 1] += f.y;
    }
  }
  __device__ static uint4 pack(const float* a) {
    return {Pair<T>::from(a[0], a[1]), Pair<T>::from(a[2], a[3]), Pair<T>::from(a[4], a[5]),
            Pair<T>::from(a[6], a[7])};
  }
};
template <>
struct Vec<float> {
  static constexpr int n = 4;
  __device__ static void add(float* acc, const uint4& v) {
    acc[0] += __uint_as_float(v.x), acc[1] += __uint_as_float(v.y), acc[2] += __uint_as_float(v.z),
        acc[3] += __uint_as_float(v.w);
  }
  __device__ static uint4 pack(const float* a) {
    return {__float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]), __float_as_uint(a[3])};
  }
};

// The sum over the ranks of vector i of their buffers (at byte `half` of each region past the flags), rank order.
template <typename T, int R>
__device__ __forceinline__ uint4 sum_at(const Peers& p, size_t half, int64_t i) {
  float acc[Vec<T>::n] = {};
#pragma unroll
  for (int r = 0; r < R; r++)
    Vec<T>::add(acc, __ldcg(reinterpret_cast<const uint4*>(p.region[r] + kDataOffset + half) + i));
  return Vec<T>::pack(acc);
}

// Note [Peer all-reduce]. in and out: nvec 16-byte vectors (they may be the same memory).
template <typename T, int R, bool kTwoShot>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(Peers p, int rank, const uint4* in, uint4* out,
                                                                   int64_t nvec) {
  __shared__ uint32_t shared_epoch;
  if (threadIdx.x == 0) shared_epoch = ++p.epoch[blockIdx.x];
  __syncthreads();
  const uint32_t epoch = shared_epoch;
  const size_t half = (epoch & 1) ? 0 : size_t(p.max_bytes);
  uint4* mine = reinterpret_cast<uint4*>(p.region[rank] + kDataOffset + half);
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(kBlocks) * kThreads;
  if (!kTwoShot) {
    for (int64_t i = first; i < nvec; i += stride) mine[i] = in[i];
    barrier<R>(p, rank, 0, epoch);
    for (int64_t i = first; i < nvec; i += stride) out[i] = sum_at<T, R>(p, half, i);
    return;
  }
  const int64_t chunk = nvec / R;  // the caller checked nvec % R == 0
  for (int c = 0; c < R; c++)
    for (int64_t i = first; i < chunk; i += stride) mine[c * chunk + i] = in[c * chunk + i];
  barrier<R>(p, rank, 0, epoch);
  for (int64_t i = first; i < chunk; i += stride) {
    const int64_t at = rank * chunk + i;
    const uint4 s = sum_at<T, R>(p, half, at);
    mine[at] = s;
    out[at] = s;
  }
  barrier<R>(p, rank, 1, epoch);
  for (int c = 0; c < R; c++) {
    if (c == rank) continue;
    const uint4* theirs = reinterpret_cast<const uint4*>(p.region[c] + kDataOffset + half);
    for (int64_t i = first; i < chunk; i += stride) out[c * chunk + i] = __ldcg(theirs + c * chunk + i);
  }
}

template <typename T, int R>
void launch(const Peers& p, int rank, const void* in, void* out, int64_t nvec, bool two_shot, cudaStream_t s) {
  const uint4* i = static_cast<const uint4*>(in);
  uint4* o = static_cast<uint4*>(out);
  if (two_shot) peer_all_reduce_kernel<T, R, true><<<kBlocks, kThreads, 0, s>>>(p, rank, i, o, nvec);
  else peer_all_reduce_kernel<T, R, false><<<kBlocks, kThreads, 0, s>>>(p, rank, i, o, nvec);
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_ranks(int R, const Peers& p, int rank, const void* in, void* out, int64_t nvec, bool two_shot,
                  cudaStream_t s) {
  switch (R) {
    case 2: return launch<T, 2>(p, rank, in, out, nvec, two_shot, s);
    case 4: return launch<T, 4>(p, rank, in, out, nvec, two_shot, s);
    case 8: return launch<T, 8>(p, rank, in, out, nvec, two_shot, s);
  }
  DSCPP_FAIL("PeerAllReduce: ", R, " ranks (2, 4 or 8)");
}

}  // namespace

struct PeerAllReduce::Impl {
  ProcessGroup* group = nullptr;
  int device = 0, rank = 0, size = 0;
  Peers peers{};
  char* region = nullptr;  // this rank's
  std::vector<char*> opened;
  volatile int* abort_host = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread monitor;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (monitor.joinable()) monitor.join();
    cuda::DeviceGuard g(device);
    for (char* r : opened) cudaIpcCloseMemHandle(r);
    if (peers.epoch) cudaFree(peers.epoch);
    if (region) cudaFree(region);
    if (abort_host) cudaFreeHost(const_cast<int*>(abort_host));
  }

  // Note [Peer all-reduce]: a dead peer shows as the store's abort key; polled once a second.
  void watch() {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(1), [&] { return stopping; })) {
      lock.unlock();
      const bool aborted = group->store() && group->store()->abort_reason().has_value();
      lock.lock();
      if (aborted) {
        *abort_host = 1;
        return;
      }
    }
  }
};

PeerAllReduce::PeerAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerAllReduce::~PeerAllReduce() = default;
int64_t PeerAllReduce::max_bytes() const { return impl_->peers.max_bytes; }

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(ProcessGroup& group, int64_t max_bytes, std::string* why) {
  auto refuse = [&](const std::string& reason) -> std::unique_ptr<PeerAllReduce> {
    if (why) *why = reason;
    return nullptr;
  };
  const int R = group.size();
  if (std::string(group.backend()) != "nccl") return refuse("the group is not on GPUs (backend " +
                                                            std::string(group.backend()) + ")");
  if (R != 2 && R != 4 && R != 8) return refuse(std::to_string(R) + " ranks (the kernels take 2, 4 or 8)");
  DSCPP_CHECK(max_bytes >= 16 && max_bytes % 16 == 0, "PeerAllReduce: max_bytes ", max_bytes,
              " must be a positive multiple of 16");
  auto impl = std::make_unique<Impl>();
  impl->group = &group;
  impl->device = cuda::current_device();
  impl->rank = group.rank();
  impl->size = R;
  cuda::DeviceGuard g(impl->device);
  const size_t bytes = kDataOffset + 2 * size_t(max_bytes);
  DSCPP_CUDA_CHECK(cudaMalloc(&impl->region, bytes));
  DSCPP_CUDA_CHECK(cudaMemset(impl->region, 0, bytes));
  DSCPP_CUDA_CHECK(cudaMalloc(&impl->peers.epoch, kBlocks * sizeof(uint32_t)));
  DSCPP_CUDA_CHECK(cudaMemset(impl->peers.epoch, 0, kBlocks * sizeof(uint32_t)));
  int* abort_host = nullptr;
  DSCPP_CUDA_CHECK(cudaHostAlloc(&abort_host, sizeof(int), cudaHostAllocMapped));
  *abort_host = 0;
  impl->abort_host = abort_host;
  int* abort_dev = nullptr;
  DSCPP_CUDA_CHECK(cudaHostGetDevicePointer(&abort_dev, abort_host, 0));
  impl->peers.abort = abort_dev;
  impl->peers.max_bytes = max_bytes;
  DSCPP_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any peer can write a flag
  cudaIpcMemHandle_t handle;
  DSCPP_CUDA_CHECK(cudaIpcGetMemHandle(&handle, impl->region));

  // Every rank's handle through the store, then every rank's verdict: all use it, or none does.
  TcpStore& store = *group.store();
  static std::atomic<int> made{0};  // a fresh key set per call (every rank creates them in the same order)
  const std::string base = "pg/" + group.name() + "/peer_all_reduce/" + std::to_string(made++) + "/";
  store.set(base + "handle/" + std::to_string(impl->rank),
            Bytes(reinterpret_cast<char*>(&handle), reinterpret_cast<char*>(&handle) + sizeof handle));
  std::string failure;
  for (int p = 0; p < R; p++) {
    if (p == impl->rank) {
      impl->peers.region[p] = impl->region;
      continue;
    }
    const Bytes b = store.get(base + "handle/" + std::to_string(p), group.timeout());
    DSCPP_CHECK(b.size() == sizeof(cudaIpcMemHandle_t), "PeerAllReduce: rank ", p, "'s handle has ", b.size(),
                " bytes");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, b.data(), sizeof h);
    void* mapped = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      failure = "rank " + std::to_string(impl->rank) + " cannot map rank " + std::to_string(p) + "'s memory (" +
                cudaGetErrorString(e) + ")";
      break;
    }
    impl->opened.push_back(static_cast<char*>(mapped));
    impl->peers.region[p] = static_cast<char*>(mapped);
  }
  store.set(base + "verdict/" + std::to_string(impl->rank), failure);
  for (int p = 0; p < R && failure.empty(); p++)
    failure = store.get_string(base + "verdict/" + std::to_string(p), group.timeout());
  // Nobody frees or leaves before every rank has read the verdicts (and so opened whatever it opens).
  group.barrier()->wait();
  if (!failure.empty()) return refuse(failure);
  Impl* raw = impl.get();
  impl->monitor = std::thread([raw] { raw->watch(); });
  return std::unique_ptr<PeerAllReduce>(new PeerAllReduce(std::move(impl)));
}

bool PeerAllReduce::fits(const Tensor& t) const {
  const DType d = t.dtype();
  return (d == DType::f32 || d == DType::bf16 || d == DType::f16) && t.device().is_cuda() &&
         t.device().index == impl_->device && int64_t(t.nbytes()) <= impl_->peers.max_bytes && t.nbytes() % 16 == 0 &&
         reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
}

void PeerAllReduce::all_reduce(Tensor& t) {
  DSCPP_CHECK(fits(t), "PeerAllReduce: ", t.str(), " does not fit (f32, bf16 or f16 on cuda:", impl_->device,
              ", 16-byte aligned, whole 16-byte vectors, at most ", impl_->peers.max_bytes, " bytes)");
  const int64_t nvec = int64_t(t.nbytes()) / 16;
  if (nvec == 0) return;
  const int R = impl_->size;
  const bool two_shot = R > 2 && int64_t(t.nbytes()) >= kTwoShotBytes && nvec % R == 0;
  cuda::DeviceGuard g(impl_->device);
  const cudaStream_t s = cuda::current_stream(impl_->device);
  switch (t.dtype()) {
    case DType::f32: return launch_ranks<float>(R, impl_->peers, impl_->rank, t.raw(), t.raw(), nvec, two_shot, s);
    case DType::bf16:
      return launch_ranks<__nv_bfloat16>(R, impl_->peers, impl_->rank, t.raw(), t.raw(), nvec, two_shot, s);
    default: return launch_ranks<__half>(R, impl_->peers, impl_->rank, t.raw(), t.raw(), nvec, two_shot, s);
  }
}

}  // namespace dscpp
