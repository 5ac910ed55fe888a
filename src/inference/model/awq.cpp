// Activation-aware weight scaling before quantization (Note [AWQ scaling], inference/quantization.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "dscpp/core/check.h"
#include "dscpp/inference/engine.h"
#include "dscpp/inference/quantization.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "inference/model/weights.h"

namespace dscpp::inference {

namespace {

// What calibration saw of one linear's input: the mean |x| per input channel and the first rows.
struct InputStats {
  std::vector<double> abs_sum;
  int64_t rows = 0;
  Tensor sample;  // [kept, in] f32
  int64_t kept = 0;
};

// dequant(quant(w)) in f32, as the served weight computes.
Tensor round_trip(const Tensor& w, const WeightQuantConfig& q) {
  QuantWeight qw = allocate_quant_weight(w.size(0), w.size(1), q, Device::cpu(), "awq");
  quantize_into(qw, w);
  Tensor out = Tensor::empty(w.shape(), DType::f32);
  ops::dequantize_weight(out, qw.q, qw.scale, qw.zero, qw.group);
  return out;
}

// w[R, K] (=) w with column k times s[k] (power +1) or divided by it (power -1).
void scale_columns(const Tensor& w, const std::vector<float>& s, int power) {
  float* p = w.data<float>();
  const int64_t R = w.size(0), K = w.size(1);
  for (int64_t r = 0; r < R; r++)
    for (int64_t k = 0; k < K; k++) p[r * K + k] = power > 0 ? p[r * K + k] * s[size_t(k)] : p[r * K + k] / s[size_t(k)];
}
// Rows [first, first + s.size()) of t ([rows] or [rows, in]; nothing when undefined), row first + j divided by s[j].
void divide_rows(const Tensor& t, int64_t first, const std::vector<float>& s) {
  if (!t.defined()) return;
  const int64_t K = t.dim() == 1 ? 1 : t.size(1);
  float* p = t.data<float>();
  for (size_t j = 0; j < s.size(); j++)
    for (int64_t k = 0; k < K; k++) p[(first + int64_t(j)) * K + k] /= s[j];
}

// ||X (W - Wq)^T||^2 over the sample rows: the output error the served weight makes on calibration inputs.
double output_error(const Tensor& x, const Tensor& w, const Tensor& wq) {
  Tensor d = Tensor::empty(w.shape(), DType::f32);
  const float *a = w.data<float>(), *b = wq.data<float>();
  float* o = d.data<float>();
  for (int64_t i = 0; i < w.numel(); i++) o[i] = a[i] - b[i];
  Tensor y = Tensor::empty({x.size(0), w.size(0)}, DType::f32);
  ops::matmul_forward(y, x, d, Tensor());
  double e = 0;
  const float* py = y.data<float>();
  for (int64_t i = 0; i < y.numel(); i++) e += double(py[i]) * double(py[i]);
  return e;
}

}  // namespace

std::vector<AwqLinear> awq_scale(InferenceModel& m, const WeightQuantConfig& q,
                                 const std::vector<std::vector<int32_t>>& calibration, const AwqOptions& o,
                                 const ProgressFn& progress) {
  DSCPP_CHECK(q.enabled, "awq_scale: no quantization to scale for");
  DSCPP_CHECK(m.device.is_cpu() && m.dtype == DType::f32 && m.tp.size == 1 && !m.quant.enabled,
              "awq_scale: a dense f32 model on the host, one rank");
  DSCPP_CHECK(o.grid >= 1 && o.sample_rows >= 1, "awq_scale: grid ", o.grid, " and sample_rows ", o.sample_rows,
              " must be >= 1");
  int64_t longest = 0;
  for (const auto& seq : calibration) longest = std::max<int64_t>(longest, int64_t(seq.size()));
  DSCPP_CHECK(longest >= 1, "awq_scale: no calibration tokens");
  DSCPP_CHECK(longest <= m.cfg.max_context, "awq_scale: a calibration sequence of ", longest, " tokens exceeds the "
              "model's context of ", m.cfg.max_context);
  // 1. Each linear's inputs over the calibration text, through the engine's own forward.
  std::map<std::pair<int64_t, LinearInput>, InputStats> seen;
  InferenceModel probe = m;  // the same weights
  probe.observe_inputs = [&](int64_t layer, LinearInput which, const Tensor& x) {
    InputStats& st = seen[{layer, which}];
    const int64_t N = x.size(0), K = x.size(1);
    if (st.abs_sum.empty()) {
      st.abs_sum.assign(size_t(K), 0.0);
      st.sample = Tensor::empty({o.sample_rows, K}, DType::f32);
    }
    const float* p = x.data<float>();
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < K; k++) st.abs_sum[size_t(k)] += std::fabs(p[n * K + k]);
    st.rows += N;
    const int64_t take = std::min(N, o.sample_rows - st.kept);
    if (take > 0) st.sample.narrow0(st.kept, take).copy_from(x.narrow0(0, take));
    st.kept += std::max<int64_t>(0, take);
  };
  {
    InferenceConfig c;
    c.state_manager.max_context = longest;
    c.state_manager.max_ragged_batch_size = longest;
    c.state_manager.max_ragged_sequence_count = 1;
    c.state_manager.memory_config.mode = "allocate";
    c.dscpp.kv_block_size = 16;
    c.state_manager.memory_config.size = (longest + 15) / 16 + 1;
    c.dscpp.prefix_caching = false;
    InferenceEngine e(std::move(probe), c);
    int64_t uid = 0;
    for (const auto& seq : calibration) {
      if (seq.empty()) continue;
      e.put({++uid}, {seq});
      e.flush(uid);
    }
  }
  // 2. Per linear, the scale exponent whose quantized weight errs least on the sampled inputs; 3. fold the scales.
  const InferenceModelConfig& c = m.cfg;
  const int64_t D = c.head_dim, q_rows = c.n_head * D, kv_rows = c.n_kv_head * D;
  std::vector<AwqLinear> out;
  const int64_t total = c.n_layer * 4;
  int64_t done = 0;
  for (int64_t l = 0; l < c.n_layer; l++) {
    LayerWeights& w = m.layers[size_t(l)];
    for (LinearInput which : {LinearInput::qkv, LinearInput::o, LinearInput::up, LinearInput::down}) {
      if (progress) progress(++done, total);
      // Where 1 / s goes: the op before the linear must scale its output channels. Attention's output is v's
      // rows only without grouped heads; GELU's output cannot carry a scale.
      if (which == LinearInput::qkv && !q.qkv) continue;
      if (which == LinearInput::o && c.n_head != c.n_kv_head) continue;
      if (which == LinearInput::down && c.mlp != MlpKind::swiglu) continue;
      auto it = seen.find({l, which});
      DSCPP_CHECK(it != seen.end() && it->second.rows > 0, "awq_scale: no calibration inputs for layer ", l);
      const InputStats& st = it->second;
      const Tensor& weight = which == LinearInput::qkv ? w.qkv_w : which == LinearInput::o ? w.o_w
                             : which == LinearInput::up ? w.up_w : w.down_w;
      const int64_t K = weight.size(1);
      check_quant_group(K, q, "layers." + std::to_string(l));
      const Tensor x = st.sample.narrow0(0, std::min(st.kept, o.sample_rows));
      std::vector<float> mean_abs(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; k++) mean_abs[size_t(k)] = float(st.abs_sum[size_t(k)] / double(st.rows));
      AwqLinear r;
      r.layer = l, r.input = which;
      std::vector<float> best(static_cast<size_t>(K), 1.0f);
      for (int64_t g = 0; g <= o.grid; g++) {
        const double alpha = double(g) / double(o.grid);
        std::vector<float> s(static_cast<size_t>(K));
        float hi = 0, lo = INFINITY;
        for (int64_t k = 0; k < K; k++) {
          s[size_t(k)] = float(std::pow(std::max(double(mean_abs[size_t(k)]), 1e-4), alpha));
          hi = std::max(hi, s[size_t(k)]), lo = std::min(lo, s[size_t(k)]);
        }
        const float mid = std::sqrt(hi * lo);  // AWQ's normalisation: the scales' geometric middle is 1
        for (float& v : s) v /= mid;
        Tensor ws = weight.clone();
        scale_columns(ws, s, +1);
        Tensor served = round_trip(ws, q);
        scale_columns(served, s, -1);
        const double err = output_error(x, weight, served);
        if (g == 0) r.rtn_error = err;
        if (g == 0 || err < r.awq_error) r.awq_error = err, r.alpha = alpha, best = s;
      }
      out.push_back(r);
      if (r.alpha == 0.0) continue;  // round-to-nearest is best: nothing to fold
      scale_columns(weight, best, +1);
      switch (which) {
        case LinearInput::qkv:
          divide_rows(w.norm1_w, 0, best), divide_rows(w.norm1_b, 0, best);
          break;
        case LinearInput::up:
          divide_rows(w.norm2_w, 0, best), divide_rows(w.norm2_b, 0, best);
          break;
        case LinearInput::o:  // v's rows of the fused qkv
          divide_rows(w.qkv_w, q_rows + kv_rows, best), divide_rows(w.qkv_b, q_rows + kv_rows, best);
          break;
        case LinearInput::down:  // the up half of gate | up: silu(gate) * up / s
          divide_rows(w.up_w, c.ffn, best), divide_rows(w.up_b, c.ffn, best);
          break;
      }
    }
  }
  return out;
}

}  // namespace dscpp::inference
