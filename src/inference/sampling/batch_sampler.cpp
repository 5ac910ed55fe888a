// The batch sampler (batch_sampler.h): packing, one upload, the ops, one download, then each row's record.
#include "inference/sampling/batch_sampler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "dscpp/core/cuda.h"
#include "dscpp/kernels/sampling_ops.h"

namespace dscpp {
namespace {

// t holds at least n elements of dt on d (pinned host memory when asked); its contents are not kept.
Tensor& grow(Tensor& t, int64_t n, DType dt, Device d, bool pinned = false) {
  if (!t.defined() || t.numel() < n || t.device() != d)
    t = pinned ? empty_pinned({std::max<int64_t>(n, 1)}, dt) : Tensor::empty({std::max<int64_t>(n, 1)}, dt, d);
  return t;
}

int32_t bits_of(float x) {
  int32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Consecutive typed views over one buffer of 4-byte words.
struct Words {
  char* base;
  Device dev;
  int64_t at = 0;
  Tensor take(const Shape& shape, DType dt) {
    Tensor t = Tensor::wrap(base + at * 4, shape, dt, dev);
    at += shape_numel(shape);
    return t;
  }
};

}  // namespace

std::vector<SampleResult> BatchSampler::sample(const Tensor& logits, const std::vector<SequenceSampler*>& rows) {
  DSCPP_CHECK(logits.defined() && logits.dim() == 2 && logits.dtype() == DType::f32, "BatchSampler: logits is ",
              logits.defined() ? logits.str() : std::string("undefined"), ", expected f32 [S, V]");
  const int64_t S = logits.size(0), V = logits.size(1);
  wait_ = 0;
  DSCPP_CHECK(int64_t(rows.size()) == S, "BatchSampler: ", rows.size(), " samplers for ", S, " rows of logits");
  const Device dev = logits.device();
  const bool on_host = dev.is_cpu();
  bool penalties = false;
  int64_t n_top = -1, T = 0;
  for (const SequenceSampler* r : rows) {
    if (!r) continue;
    n_top = std::max(n_top, r->params().logprobs);
    if (!r->penalized()) continue;
    penalties = true;
    for (const auto& [t, count] : r->history()) T += t >= 0 && t < V;  // a token outside the vocabulary: none
  }
  // Parameters: temperature, top_k, top_p, min_p, seed (2 words), step, then for penalties repetition, presence,
  // frequency, hist_start (S + 1), hist_token (T), hist_count (T).
  const int64_t n_in = 7 * S + (penalties ? 4 * S + 1 + 2 * T : 0);
  int32_t* in = grow(in_host_, n_in, DType::i32, Device::cpu(), !on_host).data<int32_t>();
  int32_t *temperature = in, *top_k = in + S, *top_p = in + 2 * S, *min_p = in + 3 * S, *seed = in + 4 * S;
  int32_t *step = in + 6 * S, *rep = in + 7 * S, *pres = in + 8 * S, *freq = in + 9 * S, *hs = in + 10 * S;
  int32_t *ht = hs + S + 1, *hc = ht + T;
  if (penalties) hs[0] = 0;
  for (int64_t s = 0; s < S; s++) {
    const SequenceSampler* r = rows[size_t(s)];
    static const SamplingParams kUnwanted;
    const SamplingParams& p = r ? r->params() : kUnwanted;
    temperature[s] = bits_of(r ? p.temperature : 0.0f);  // a row nobody wants: the cheapest draw, greedy
    top_k[s] = int32_t(std::min<int64_t>(p.top_k, V));
    top_p[s] = bits_of(p.top_p), min_p[s] = bits_of(p.min_p);
    seed[2 * s] = int32_t(uint32_t(p.seed)), seed[2 * s + 1] = int32_t(uint32_t(p.seed >> 32));
    step[s] = r ? int32_t(r->steps()) : 0;
    if (!penalties) continue;
    rep[s] = bits_of(p.repetition_penalty), pres[s] = bits_of(p.presence_penalty);
    freq[s] = bits_of(p.frequency_penalty);
    int32_t j = hs[s];
    if (r && r->penalized())
      for (const auto& [t, count] : r->history())
        if (t >= 0 && t < V) ht[j] = t, hc[j] = count, j++;
    hs[s + 1] = j;
  }
  Tensor in_t = in_host_;
  if (!on_host) {
    grow(in_dev_, n_in, DType::i32, dev);
    copy_async(in_dev_.slice(0, n_in), in_host_.slice(0, n_in));
    in_t = in_dev_;
  }
  Words w{static_cast<char*>(in_t.raw()), dev};
  const Tensor t_temp = w.take({S}, DType::f32), t_topk = w.take({S}, DType::i32), t_topp = w.take({S}, DType::f32);
  const Tensor t_minp = w.take({S}, DType::f32), t_seed = w.take({S, 2}, DType::i32), t_step = w.take({S}, DType::i32);

  const int64_t n = std::max<int64_t>(n_top, 0), n_out = 2 * S + 2 * S * n;
  Tensor& out = on_host ? grow(out_host_, n_out, DType::i32, dev) : grow(out_dev_, n_out, DType::i32, dev);
  Words o{static_cast<char*>(out.raw()), dev};
  const Tensor tokens = o.take({S}, DType::i32), chosen = o.take({S}, DType::f32);
  const Tensor top_ids = o.take({S, n}, DType::i32), top_lp = o.take({S, n}, DType::f32);

  Tensor l = logits;
  if (penalties) {
    const Tensor t_rep = w.take({S}, DType::f32), t_pres = w.take({S}, DType::f32), t_freq = w.take({S}, DType::f32);
    const Tensor t_hs = w.take({S + 1}, DType::i32), t_ht = w.take({T}, DType::i32), t_hc = w.take({T}, DType::i32);
    l = grow(penalized_, S * V, DType::f32, dev).view_at(0, {S, V});
    ops::apply_penalties(l, logits, t_hs, t_ht, t_hc, t_rep, t_pres, t_freq);
  }
  ops::sample_rows(tokens, l, t_temp, t_topk, t_topp, t_minp, t_seed, t_step);
  if (n_top >= 0) ops::logprobs_rows(chosen, top_ids, top_lp, logits, tokens);

  const int64_t n_back = n_top >= 0 ? n_out : S;
  const int32_t* res = out.data<int32_t>();
  if (!on_host) {
    grow(out_host_, n_out, DType::i32, Device::cpu(), true);
    copy_async(out_host_.slice(0, n_back), out_dev_.slice(0, n_back));
    const auto w0 = std::chrono::steady_clock::now();
    cuda_stream_synchronize(dev.index);
    wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    res = out_host_.data<int32_t>();
  }
  std::vector<SampleResult> results(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; s++) {
    SequenceSampler* r = rows[size_t(s)];
    if (!r) continue;
    SampleResult& x = results[size_t(s)] = r->record(res[s]);
    const int64_t k = r->params().logprobs;
    if (k < 0) continue;
    auto as_float = [](int32_t b) {
      float f;
      std::memcpy(&f, &b, sizeof f);
      return f;
    };
    x.logprob = as_float(res[S + s]);
    for (int64_t j = 0; j < k; j++)
      x.top.push_back({res[2 * S + s * n + j], as_float(res[2 * S + S * n + s * n + j])});
  }
  return results;
}

}  // namespace dscpp
