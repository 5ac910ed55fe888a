// cuDNN fused attention for the CUDA attention ops. Compiled as host C++ (no kernels of ours here), only in CUDA
// builds that found cudnn_frontend.h (CMake defines DSCPP_WITH_CUDNN_ATTENTION); otherwise both calls decline.
#ifdef DSCPP_WITH_CUDA
#include "attention_cudnn.h"

#ifndef DSCPP_WITH_CUDNN_ATTENTION
namespace dscpp::cuda::cudnn_attention {
bool forward(AttentionBackend, DType, const Shape&, void*, float*, const void*, int, cudaStream_t) { return false; }
bool backward(AttentionBackend, DType, const Shape&, void*, const void*, const void*, const void*, const float*, int,
              cudaStream_t) {
  return false;
}
}  // namespace dscpp::cuda::cudnn_attention
#else
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dscpp/core/check.h"
#include "dscpp/core/tensor.h"

namespace dscpp::cuda::cudnn_attention {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = fe::graph::Tensor_attributes;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  bool backward;
  DType t;
  int device, B, T, H, Hkv, D;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = size_t(k.backward) * 31 + size_t(k.t);
    for (int v : {k.device, k.B, k.T, k.H, k.Hkv, k.D}) h = h * 1000003u + size_t(v);
    return h;
  }
};

struct Plan {
  std::shared_ptr<Graph> graph;  // null: cuDNN declined this call
  int64_t workspace = 0;
  std::string why;               // why it declined
};

struct State {
  std::mutex mu;
  std::unordered_map<Key, Plan, KeyHash> plans;
  std::unordered_map<int, cudnnHandle_t> handles;  // per device; kept for the process's life; null: unusable
};
State& state() {
  static State* s = new State;  // never destroyed: handles may be used by other static destructors' work
  return *s;
}

// Null when cuDNN cannot start on this machine (a partial install, a driver it does not support): then every call
// declines and our kernels run, after one message, rather than failing the job.
cudnnHandle_t handle_for(State& st, int device) {
  auto it = st.handles.find(device);
  if (it != st.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t rc = cudnnCreate(&h);  // the caller's DeviceGuard made `device` current
  if (rc != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "[dscpp] cuDNN attention off on cuda:%d: cudnnCreate failed (%s); using own kernels\n",
                 device, cudnnGetErrorString(rc));
    h = nullptr;
  }
  st.handles.emplace(device, h);
  return h;
}

// Strides of the packed layouts in elements, as [B, heads, T, D] views.
std::vector<int64_t> qkv_strides(const Key& k) {
  const int64_t R = int64_t(k.H + 2 * k.Hkv) * k.D;
  return {int64_t(k.T) * R, k.D, R, 1};
}
std::vector<int64_t> out_strides(const Key& k) {
  const int64_t R = int64_t(k.H) * k.D;
  return {int64_t(k.T) * R, k.D, R, 1};
}

Plan build(const Key& k, cudnnHandle_t handle) {
  Plan p;
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(k.t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> q_dim{k.B, k.H, k.T, k.D}, kv_dim{k.B, k.Hkv, k.T, k.D}, st_dim{k.B, k.H, k.T, 1},
      st_stride{int64_t(k.H) * k.T, k.T, 1, 1};
  auto input = [&](const char* name, Uid uid, const std::vector<int64_t>& dim, const std::vector<int64_t>& stride) {
    return g->tensor(TensorAttr().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  auto Q = input("Q", kQ, q_dim, qkv_strides(k));
  auto K = input("K", kK, kv_dim, qkv_strides(k));
  auto V = input("V", kV, kv_dim, qkv_strides(k));
  const float scale = 1.0f / std::sqrt(float(k.D));
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true)
                    .set_attn_scale(scale);
    auto [O, stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim(q_dim).set_stride(out_strides(k));
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(st_dim).set_stride(st_stride);
  } else {
    auto O = input("O", kO, q_dim, out_strides(k));
    auto dO = input("dO", kDO, q_dim, out_strides(k));
    auto stats = g->tensor(TensorAttr().set_name("Stats").set_uid(kStats).set_dim(st_dim).set_stride(st_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_causal_mask(true)
                    .set_attn_scale(scale);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_uid(kDQ).set_dim(q_dim).set_stride(qkv_strides(k));
    dK->set_output(true).set_uid(kDK).set_dim(kv_dim).set_stride(qkv_strides(k));
    dV->set_output(true).set_uid(kDV).set_dim(kv_dim).set_stride(qkv_strides(k));
  }
  auto step = [&](const char* what, fe::error_t e) {
    if (e.is_good()) return true;
    p.why = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (!step("validate", g->validate()) || !step("build_operation_graph", g->build_operation_graph(handle)) ||
      !step("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A})) ||
      !step("check_support", g->check_support(handle)) ||
      !step("build_plans", g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) ||
      !step("get_workspace_size", g->get_workspace_size(p.workspace)))
    return p;
  p.graph = std::move(g);
  return p;
}

bool supported_call(AttentionBackend be, DType t, const Shape& s, std::initializer_list<const void*> ptrs) {
  if (be == AttentionBackend::own) return false;
  // A graph is built per shape (tens to hundreds of ms). Generation without a KV cache calls with every length
  // 1, 2, 3, ...: left to our kernels unless T is a multiple of 64, as training shapes are (explicit "cudnn" takes
  // every T).
  if (be == AttentionBackend::automatic && s.T % 64) return false;
  if (t != DType::bf16 && t != DType::f16) return false;
  if (s.D % 8 || s.D > 128) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}

bool run(AttentionBackend be, const Key& k, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  cudnnHandle_t h = handle_for(st, k.device);
  if (!h) return false;
  auto it = st.plans.find(k);
  if (it == st.plans.end()) {
    Plan built;
    try {
      built = build(k, h);
    } catch (const std::exception& e) {  // the frontend reports most problems as error_t, some by throwing
      built.why = e.what();
    }
    it = st.plans.emplace(k, std::move(built)).first;
    if (!it->second.graph && be == AttentionBackend::cudnn)
      std::fprintf(stderr, "[dscpp] cuDNN attention declined %s B=%d T=%d H=%d Hkv=%d D=%d (%s); using own kernels\n",
                   k.backward ? "backward" : "forward", k.B, k.T, k.H, k.Hkv, k.D, it->second.why.c_str());
  }
  Plan& p = it->second;
  if (!p.graph) return false;
  cudnnStatus_t rc = cudnnSetStream(h, stream);
  DSCPP_CHECK(rc == CUDNN_STATUS_SUCCESS, "cudnnSetStream: ", cudnnGetErrorString(rc));
  Tensor ws;  // stream-ordered reuse by the caching allocator (Note [Current stream])
  if (p.workspace > 0) ws = Tensor::empty({p.workspace}, DType::i8, Device::cuda(k.device));
  fe::error_t e = p.graph->execute(h, pack, ws.defined() ? ws.raw() : nullptr);
  DSCPP_CHECK(e.is_good(), "cuDNN attention ", k.backward ? "backward" : "forward", " B=", k.B, " T=", k.T, " H=",
              k.H, " Hkv=", k.Hkv, " D=", k.D, " failed: ", e.get_message());
  return true;
}

void* mut(const void* p) { return const_cast<void*>(p); }

}  // namespace

bool forward(AttentionBackend be, DType t, const Shape& s, void* out, float* lse, const void* qkv, int device,
             cudaStream_t stream) {
  if (!supported_call(be, t, s, {out, lse, qkv})) return false;
  const Key k{false, t, device, s.B, s.T, s.H, s.Hkv, s.D};
  const size_t e = 2;  // bytes per bf16/f16 element
  const char* base = static_cast<const char*>(qkv);
  std::unordered_map<int64_t, void*> pack{{kQ, mut(base)},
                                          {kK, mut(base + size_t(s.H) * s.D * e)},
                                          {kV, mut(base + size_t(s.H + s.Hkv) * s.D * e)},
                                          {kO, out},
                                          {kStats, lse}};
  return run(be, k, pack, stream);
}

bool backward(AttentionBackend be, DType t, const Shape& s, void* dqkv, const void* dout, const void* qkv,
              const void* out, const float* lse, int device, cudaStream_t stream) {
  if (!supported_call(be, t, s, {dqkv, dout, qkv, out, lse})) return false;
  const Key k{true, t, device, s.B, s.T, s.H, s.Hkv, s.D};
  const size_t e = 2, koff = size_t(s.H) * s.D * e, voff = size_t(s.H + s.Hkv) * s.D * e;
  const char* base = static_cast<const char*>(qkv);
  char* dbase = static_cast<char*>(dqkv);
  std::unordered_map<int64_t, void*> pack{{kQ, mut(base)},        {kK, mut(base + koff)}, {kV, mut(base + voff)},
                                          {kO, mut(out)},         {kDO, mut(dout)},       {kStats, mut(lse)},
                                          {kDQ, dbase},           {kDK, dbase + koff},    {kDV, dbase + voff}};
  return run(be, k, pack, stream);
}

}  // namespace dscpp::cuda::cudnn_attention
#endif  // DSCPP_WITH_CUDNN_ATTENTION
#endif  // DSCPP_WITH_CUDA
