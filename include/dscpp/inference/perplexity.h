// Held-out perplexity through the inference engine's forward (the ragged forward over the paged KV cache, with a
// logits row for every token): how much a model's predictions of a token stream lose to quantization or any other
// change of the serving path, measured on the path that serves.
//
//   PerplexityResult r = perplexity(load_inference_model(dir, opts), tokens, {.window = 512});
//   printf("%.3f\n", r.perplexity());
//
// The stream is cut into consecutive windows of `window` tokens (a shorter tail is left out); each window is a fresh
// sequence whose logits at positions 0 .. window-2 score the tokens at 1 .. window-1, so every window scores
// window-1 tokens with no context from the one before. That is the training loss on the same windows (inputs
// window[0:-1], targets window[1:]), which is how the tests check it.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

struct PerplexityOptions {
  int64_t window = 512;        // tokens per window, 2 .. the model's max_context
  int64_t max_windows = 0;     // score at most this many windows (0: every full window of the stream)
  int64_t batch_tokens = 2048; // tokens per forward: max(1, batch_tokens / window) windows side by side
  bool fp8_kv_cache = false;   // the KV cache in fp8 e4m3 (dscpp.kv_cache_dtype "fp8"), else the model's dtype
};

struct PerplexityResult {
  double nll = 0;          // sum over the scored tokens of -log p(token | the window before it)
  int64_t scored = 0;      // tokens scored: windows * (window - 1)
  int64_t windows = 0;
  int64_t forward_tokens = 0;  // tokens through the model: windows * window
  double seconds = 0;      // the forwards and their losses, waited for

  double mean_nll() const { return scored ? nll / double(scored) : 0; }
  double perplexity() const { return std::exp(mean_nll()); }
  double tokens_per_second() const { return seconds > 0 ? double(forward_tokens) / seconds : 0; }
};

// Refuses a window outside 2 .. max_context and a stream shorter than one window, by name.
PerplexityResult perplexity(const InferenceModel& m, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opts = {});

}  // namespace dscpp::inference
