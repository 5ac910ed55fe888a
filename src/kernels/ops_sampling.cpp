// Checked entry points of the sampling ops (sampling_ops.h): shapes, dtypes, one device, and on the CPU the history
// tokens and the sampled tokens the ops index with. CUDA tensors go to src/kernels/cuda/sampling.cu, whose kernels
// skip an out-of-range index instead (reading them here would cost a sync).
#include "dscpp/kernels/sampling_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

// logits f32 [S, V]; returns {S, V}.
std::pair<int64_t, int64_t> check_logits(const char* op, const Tensor& logits) {
  DSCPP_CHECK(logits.defined() && logits.dtype() == DType::f32 && logits.dim() == 2 && logits.size(1) > 0, op,
              ": logits is ", logits.defined() ? logits.str() : std::string("undefined"), ", expected f32 [S, V]");
  return {logits.size(0), logits.size(1)};
}

void check_vec(const char* op, const char* name, const Tensor& t, DType dt, int64_t numel, const Tensor& logits) {
  DSCPP_CHECK(t.defined() && t.dtype() == dt && t.device() == logits.device() && t.numel() == numel, op, ": ", name,
              " is ", t.defined() ? t.str() : std::string("undefined"), ", expected ", dtype_name(dt), " on ",
              logits.device().str(), " (as logits) with ", numel, " elements");
}

}  // namespace

void apply_penalties(const Tensor& out, const Tensor& logits, const Tensor& hist_start, const Tensor& hist_token,
                     const Tensor& hist_count, const Tensor& repetition, const Tensor& presence,
                     const Tensor& frequency) {
  const char* op = "apply_penalties";
  const auto [S, V] = check_logits(op, logits);
  check_vec(op, "out", out, DType::f32, S * V, logits);
  DSCPP_CHECK(out.raw() != logits.raw(), op, ": out must not alias logits");
  check_vec(op, "hist_start", hist_start, DType::i32, S + 1, logits);
  const int64_t T = hist_token.defined() ? hist_token.numel() : -1;
  check_vec(op, "hist_token", hist_token, DType::i32, T, logits);
  check_vec(op, "hist_count", hist_count, DType::i32, T, logits);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"repetition", repetition},
                                {"presence", presence}, {"frequency", frequency}})
    check_vec(op, name, t, DType::f32, S, logits);
#ifdef DSCPP_WITH_CUDA
  if (logits.device().is_cuda())
    return cuda::apply_penalties(out, logits, hist_start, hist_token, hist_count, repetition, presence, frequency);
#endif
  const int32_t *hs = hist_start.data<int32_t>(), *ht = hist_token.data<int32_t>();
  DSCPP_CHECK(hs[0] == 0 && hs[S] == T, op, ": hist_start must run from 0 to T = ", T, ", got ", hs[0], " .. ", hs[S]);
  for (int64_t s = 0; s < S; s++) {
    DSCPP_CHECK(hs[s] <= hs[s + 1], op, ": hist_start[", s + 1, "] = ", hs[s + 1], " < hist_start[", s, "]");
    for (int32_t j = hs[s]; j < hs[s + 1]; j++)
      DSCPP_CHECK(ht[j] >= 0 && ht[j] < V, op, ": hist_token[", j, "] = ", ht[j], " is outside the vocabulary of ", V);
  }
  cpu::apply_penalties(out.data<float>(), logits.data<float>(), hs, ht, hist_count.data<int32_t>(),
                       repetition.data<float>(), presence.data<float>(), frequency.data<float>(), S, V);
}

void sample_rows(const Tensor& tokens, const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
                 const Tensor& top_p, const Tensor& min_p, const Tensor& seed, const Tensor& step) {
  const char* op = "sample_rows";
  const auto [S, V] = check_logits(op, logits);
  check_vec(op, "tokens", tokens, DType::i32, S, logits);
  check_vec(op, "temperature", temperature, DType::f32, S, logits);
  check_vec(op, "top_k", top_k, DType::i32, S, logits);
  check_vec(op, "top_p", top_p, DType::f32, S, logits);
  check_vec(op, "min_p", min_p, DType::f32, S, logits);
  check_vec(op, "seed", seed, DType::i32, 2 * S, logits);
  check_vec(op, "step", step, DType::i32, S, logits);
#ifdef DSCPP_WITH_CUDA
  if (logits.device().is_cuda()) return cuda::sample_rows(tokens, logits, temperature, top_k, top_p, min_p, seed, step);
#endif
  cpu::sample_rows(tokens.data<int32_t>(), logits.data<float>(), temperature.data<float>(), top_k.data<int32_t>(),
                   top_p.data<float>(), min_p.data<float>(), seed.data<int32_t>(), step.data<int32_t>(), S, V);
}

void logprobs_rows(const Tensor& chosen, const Tensor& top_ids, const Tensor& top_logprob, const Tensor& logits,
                   const Tensor& tokens) {
  const char* op = "logprobs_rows";
  const auto [S, V] = check_logits(op, logits);
  check_vec(op, "chosen", chosen, DType::f32, S, logits);
  check_vec(op, "tokens", tokens, DType::i32, S, logits);
  const int64_t n = S > 0 && top_ids.defined() ? top_ids.numel() / S : 0;
  DSCPP_CHECK(n >= 0 && n <= 20 && n <= V, op, ": top_ids holds ", n, " tokens a row, expected 0 to min(20, V)");
  check_vec(op, "top_ids", top_ids, DType::i32, S * n, logits);
  check_vec(op, "top_logprob", top_logprob, DType::f32, S * n, logits);
#ifdef DSCPP_WITH_CUDA
  if (logits.device().is_cuda()) return cuda::logprobs_rows(chosen, top_ids, top_logprob, logits, tokens);
#endif
  const int32_t* tk = tokens.data<int32_t>();
  for (int64_t s = 0; s < S; s++)
    DSCPP_CHECK(tk[s] >= 0 && tk[s] < V, op, ": tokens[", s, "] = ", tk[s], " is outside the vocabulary of ", V);
  cpu::logprobs_rows(chosen.data<float>(), top_ids.data<int32_t>(), top_logprob.data<float>(), logits.data<float>(),
                     tk, S, V, n);
}

}  // namespace dscpp::ops
