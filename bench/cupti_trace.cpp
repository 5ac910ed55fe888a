// Every kernel, copy, set and CUDA API call of a process, with GPU and host timestamps, for machines that have CUPTI
// but no Nsight Systems (the lent H100/H200 image). A CUDA injection library: the driver loads it at cuInit when
// CUDA_INJECTION64_PATH names it, so any binary can be traced unchanged:
//   CUDA_INJECTION64_PATH=build-gpu/bench/libdscpp_cupti_trace.so DSCPP_CUPTI_OUT=/tmp/acts.csv
//   NVTX_INJECTION64_PATH=/usr/local/cuda/lib64/libcupti.so   (optional: NVTX ranges too)
//       build-gpu/bench/train_bench --models llama-1b --batch 16 --warmup 3 --steps 1 --nvtx-step
//   python3 scripts/gpu_gaps.py /tmp/acts.csv
// The file has one row per record: kind (kernel | memcpy | memset | runtime | driver | range_start | range_end),
// start ns, end ns, correlation id (an API call and the GPU work it launched share one; a range's id), stream id
// (0 for API calls and ranges), name.
// Records are written when CUPTI hands back a full buffer and at exit. Under a launcher (RANK set) each rank writes
// DSCPP_CUPTI_OUT.rank<R>.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = 8 << 20;
std::FILE* g_out = nullptr;
std::mutex g_mu;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, msg ? msg : "?");
}

// "void ns::kern<float, 4>(float*, int)" -> "ns::kern<float; 4>": no return type, no parameters, and no commas for
// the CSV to split on.
std::string kernel_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  if (!s.empty() && s.back() == ')') {  // the parameter list: back to its matching '('
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (char& c : s)
    if (c == ',') c = ';';
  return s;
}

const char* api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "?";
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        std::fprintf(g_out, "kernel,%llu,%llu,%u,%u,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                     k->correlationId, k->streamId, kernel_name(k->name).c_str());
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        std::fprintf(g_out, "memcpy,%llu,%llu,%u,%u,memcpy kind %u %llu B\n", (unsigned long long)m->start,
                     (unsigned long long)m->end, m->correlationId, m->streamId, unsigned(m->copyKind),
                     (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        std::fprintf(g_out, "memset,%llu,%llu,%u,%u,memset %llu B\n", (unsigned long long)m->start,
                     (unsigned long long)m->end, m->correlationId, m->streamId, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER: {  // NVTX ranges: the start carries the name, the end only the id
        auto* m = reinterpret_cast<CUpti_ActivityMarker2*>(rec);
        const bool start = m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START;
        if (!start && !(m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END)) break;
        std::fprintf(g_out, "%s,%llu,%llu,%u,0,%s\n", start ? "range_start" : "range_end",
                     (unsigned long long)m->timestamp, (unsigned long long)m->timestamp, m->id,
                     start && m->name ? m->name : "");
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        const bool rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        std::fprintf(g_out, "%s,%llu,%llu,%u,0,%s\n", rt ? "runtime" : "driver", (unsigned long long)a->start,
                     (unsigned long long)a->end, a->correlationId,
                     api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid));
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* env = std::getenv("DSCPP_CUPTI_OUT");
  std::string path = env && *env ? env : "cupti_trace.csv";
  if (const char* rank = std::getenv("RANK")) path += std::string(".rank") + rank;
  g_out = std::fopen(path.c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", path.c_str());
    return 0;
  }
  std::fprintf(g_out, "kind,start,end,correlation,stream,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                               CUPTI_ACTIVITY_KIND_MARKER})
    check(cuptiActivityEnable(k), "cuptiActivityEnable");
  std::atexit(finish);
  return 1;
}
