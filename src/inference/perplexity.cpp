// perplexity (inference/perplexity.h): windows of the stream as fresh sequences through the ragged forward, a logits
// row for every token, the cross-entropy of each row against the next token computed where the logits are.
#include "dscpp/inference/perplexity.h"

#include <algorithm>
#include <chrono>

#include "dscpp/core/check.h"
#include "dscpp/kernels/ops.h"

namespace dscpp::inference {

PerplexityResult perplexity(const InferenceModel& m, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& o) {
  const int64_t W = o.window, V = m.cfg.vocab;
  DSCPP_CHECK(W >= 2 && W <= m.cfg.max_context, "perplexity: the window (", W, " tokens) must be from 2 to the "
              "model's max_context ", m.cfg.max_context);
  int64_t n = int64_t(tokens.size()) / W;
  if (o.max_windows > 0) n = std::min(n, o.max_windows);
  DSCPP_CHECK(n > 0, "perplexity: ", tokens.size(), " tokens do not fill one window of ", W);
  for (int64_t i = 0; i < n * W; i++)
    DSCPP_CHECK(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < V, "perplexity: token ", i, " is ", tokens[size_t(i)],
                ", outside the model's vocabulary of ", V);
  // Each forward's windows get blocks of their own; the next forward's windows reuse them (fresh sequences
  // overwrite every slot they read).
  const int64_t per = std::max<int64_t>(1, o.batch_tokens / W), bs = 64, blocks = (W + bs - 1) / bs;
  KVCache cache(kv_cache_shape(m.cfg, per * blocks, bs), o.fp8_kv_cache ? DType::fp8_e4m3 : m.dtype, m.device);
  PerplexityResult r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w0 = 0; w0 < n; w0 += per) {
    const int64_t k = std::min(per, n - w0), N = k * W;
    RaggedBatch b;
    b.max_blocks_per_seq = int32_t(blocks);
    b.seq_start = {0};
    Tensor targets = Tensor::empty({N}, DType::i32);
    for (int64_t s = 0; s < k; s++) {
      const int32_t* t = tokens.data() + (w0 + s) * W;
      for (int64_t i = 0; i < W; i++) {
        b.tokens.push_back(t[i]);
        b.positions.push_back(int32_t(i));
        targets.data<int32_t>()[s * W + i] = i + 1 < W ? t[i + 1] : -1;  // a window's last token predicts nothing
      }
      b.seq_start.push_back(int32_t((s + 1) * W));
      b.seq_seen.push_back(0);
      for (int64_t j = 0; j < blocks; j++) b.block_table.push_back(int32_t(s * blocks + j));
    }
    const Tensor logits = forward(m, b, cache, /*all_tokens=*/true);
    Tensor losses = Tensor::empty({N}, DType::f32, m.device);
    ops::crossentropy_forward(losses, logits, m.device.is_cpu() ? targets : targets.to(m.device));
    if (!m.device.is_cpu()) losses = losses.to(Device::cpu());
    for (int64_t i = 0; i < N; i++) r.nll += double(losses.data<float>()[i]);
    r.windows += k;
    r.forward_tokens += N;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.scored = r.windows * (W - 1);
  return r;
}

}  // namespace dscpp::inference
