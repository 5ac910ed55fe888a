// Device queries, checked-call errors, current device/stream, guards and events (see cuda_runtime.cuh).
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/cuda_runtime.cuh"
#include "dscpp/core/allocator.h"
#include "dscpp/core/device_memory.h"

#include <execinfo.h>

#include <array>
#include <cctype>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

namespace dscpp {

int cuda_device_count() {
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: not an error for us, clear it
      return 0;
    }
    return count;
  }();
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

static void check_device_index(int device) {
  int n = cuda_device_count();
  DSCPP_CHECK(n > 0, "no CUDA device is present");
  DSCPP_CHECK(device >= 0 && device < n, "CUDA device ", device, " out of range: this machine has ", n);
}

void cuda_set_device(int device) {
  check_device_index(device);
  DSCPP_CUDA_CHECK(cudaSetDevice(device));
}

void cuda_synchronize(int device) {
  if (device < 0) device = cuda::current_device();
  check_device_index(device);
  cuda::DeviceGuard g(device);
  DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
}

void cuda_stream_synchronize(int device) {
  if (device < 0) device = cuda::current_device();
  check_device_index(device);
  cuda::DeviceGuard g(device);
  DSCPP_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(device)));
}

int cuda_current_stream_urgency(int device) {
  if (device < 0) device = cuda::current_device();
  check_device_index(device);
  cuda::DeviceGuard g(device);
  int priority = 0;
  DSCPP_CUDA_CHECK(cudaStreamGetPriority(cuda::current_stream(device), &priority));
  return cuda::least_stream_priority() - priority;
}

std::string cuda_device_name(int device) {
  check_device_index(device);
  cudaDeviceProp p{};
  DSCPP_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

std::string cuda_device_pci_id(int device) {
  char id[32] = {};
  if (device < 0 || device >= cuda_device_count() || cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess)
    return "";
  std::string s = id;  // "00000000:1B:00.0" or "0000:1B:00.0": sysfs has a 4-digit domain, lower case
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s.find(':') == 8) s = s.substr(4);
  return s;
}

int64_t cuda_device_memory(int device) {
  check_device_index(device);
  cudaDeviceProp p{};
  DSCPP_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return int64_t(p.totalGlobalMem);
}

int64_t cuda_device_free_memory(int device) {
  check_device_index(device);
  int prev = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&prev));
  DSCPP_CUDA_CHECK(cudaSetDevice(device));
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  DSCPP_CUDA_CHECK(cudaSetDevice(prev));
  DSCPP_CUDA_CHECK(e);
  const MemoryStats st = allocator_for(Device::cuda(device)).stats();
  return int64_t(free) + (st.reserved_bytes - st.current_bytes);
}

int64_t cuda_workspace_pool_bytes(int device) {
  check_device_index(device);
  cudaMemPool_t pool = nullptr;
  DSCPP_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device));
  uint64_t bytes = 0;
  DSCPP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes));
  return int64_t(bytes);
}

namespace {
std::atomic<bool> g_error_backtrace{false};
}  // namespace

void set_cuda_error_backtrace(bool on) { g_error_backtrace.store(on, std::memory_order_relaxed); }

namespace cuda {

// set_cuda_error_backtrace(true): a CUDA error's message also carries the thread and the call stack that met it, for
// errors whose call site says little (a stream wait inside a collective's wait() can be reached from many places).
static std::string error_context() {
  if (!g_error_backtrace.load(std::memory_order_relaxed)) return "";
  void* frames[48];
  const int n = backtrace(frames, 48);
  char** names = backtrace_symbols(frames, n);
  std::ostringstream os;
  os << "; thread " << std::this_thread::get_id() << ", call stack:";
  for (int i = 1; i < n && names; i++) os << "\n    " << names[i];
  std::free(names);
  return os.str();
}

void cuda_error(const char* stmt, const char* file, int line, cudaError_t e) {
  throw Error(detail::concat("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in `", stmt,
                             "` at ", file, ":", line, error_context()));
}

void cublas_error(const char* stmt, const char* file, int line, cublasStatus_t s) {
  throw Error(detail::concat("cuBLAS error ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ") in `",
                             stmt, "` at ", file, ":", line));
}

int current_device() {
  int d = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

namespace {
constexpr int kMaxDevices = 64;
std::mutex g_stream_mutex;
std::array<cudaStream_t, kMaxDevices> g_streams{};  // created on first use, live for the process
thread_local std::array<cudaStream_t, kMaxDevices> t_override{};
thread_local std::array<bool, kMaxDevices> t_has_override{};

cudaStream_t default_stream(int device) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  if (!g_streams[size_t(device)]) {
    DeviceGuard g(device);
    DSCPP_CUDA_CHECK(
        cudaStreamCreateWithPriority(&g_streams[size_t(device)], cudaStreamNonBlocking, compute_stream_priority()));
  }
  return g_streams[size_t(device)];
}
}  // namespace

int least_stream_priority() {
  int least = 0, greatest = 0;
  DSCPP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return least;
}

int compute_stream_priority() {
  int least = 0, greatest = 0;
  DSCPP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

cudaStream_t current_stream(int device) {
  check_device_index(device);
  DSCPP_CHECK(device < kMaxDevices, "at most ", kMaxDevices, " CUDA devices are supported");
  if (t_has_override[size_t(device)]) return t_override[size_t(device)];
  return default_stream(device);
}

DeviceGuard::DeviceGuard(int device) : prev_(current_device()) {
  if (device != prev_) DSCPP_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != prev_) (void)cudaSetDevice(prev_);  // destructors do not throw
}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device), prev_(current_stream(device)) {
  t_override[size_t(device)] = stream;
  t_has_override[size_t(device)] = true;
}

StreamGuard::~StreamGuard() { t_override[size_t(device_)] = prev_; }

Event::Event() { DSCPP_CUDA_CHECK(cudaEventCreate(&ev_)); }
Event::~Event() {
  if (ev_) (void)cudaEventDestroy(ev_);
}
void Event::record(cudaStream_t stream) { DSCPP_CUDA_CHECK(cudaEventRecord(ev_, stream)); }
void Event::wait(cudaStream_t stream) const { DSCPP_CUDA_CHECK(cudaStreamWaitEvent(stream, ev_, 0)); }
void Event::synchronize() const { DSCPP_CUDA_CHECK(cudaEventSynchronize(ev_)); }
bool Event::query() const {
  cudaError_t e = cudaEventQuery(ev_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  DSCPP_CUDA_CHECK(e);
  return true;
}
float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  DSCPP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.ev_, ev_));
  return ms;
}

}  // namespace cuda
}  // namespace dscpp
#endif  // DSCPP_WITH_CUDA
