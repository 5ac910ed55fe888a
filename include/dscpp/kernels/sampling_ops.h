// The op contracts of token sampling (the semantics of include/dscpp/inference/sampler.h, row by row), in the
// conventions of ops.h (shape letters, "(=)" overwrites): S rows of V logits, f32. Each has a CPU reference
// (src/kernels/cpu/sampling.cpp) and a CUDA twin (src/kernels/cuda/sampling.cu); every tensor of a call is on one
// device. The CPU entry points check the indices they read and throw; the CUDA kernels skip an out-of-range history
// token instead (checking it on the host would cost a sync).
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp::ops {

// out[S,V] (=) logits with each row's penalties over its history: the tokens hist_token[hist_start[s] ..
// hist_start[s+1]) (i32; hist_start i32[S+1] CSR, each token at most once per row), hist_count[T] (i32) the times
// each was sampled (0: prompt only). Per history token: l = l > 0 ? l / repetition[s] : l * repetition[s]; then,
// if its count > 0, l -= frequency[s] * count + presence[s]. Rows without history are copied. out may not alias
// logits (logprobs read the raw logits).
void apply_penalties(const Tensor& out, const Tensor& logits, const Tensor& hist_start, const Tensor& hist_token,
                     const Tensor& hist_count, const Tensor& repetition, const Tensor& presence,
                     const Tensor& frequency);

// tokens[S] (i32, =) one draw per row of logits[S,V]. temperature[s] == 0: the argmax (ties to the lower id). Else
// w_i = exp((l_i - max l) / temperature[s]) and the candidates are the tokens with l_i >= max(Tk, Tp) and
// w_i >= min_p[s]: Tk the top_k[s]-th largest logit (top_k <= 0 or >= V: no cut), Tp the largest logit tau such
// that the w-mass of the tokens with tau <= l_i (and l_i >= Tk) reaches top_p[s] times that of the tokens with
// l_i >= Tk. u = the first uniform of Philox(seed, counter = step[s]) (Rng(RngState{seed, step, 4}).uniform()),
// seed[S,2] (i32) the u64 seed's low and high words, step[S] (i32); the token is the first candidate, in ascending
// id order, whose cumulative w exceeds u times the candidates' sum. temperature, top_p, min_p: f32[S]; top_k i32[S].
void sample_rows(const Tensor& tokens, const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
                 const Tensor& top_p, const Tensor& min_p, const Tensor& seed, const Tensor& step);

// The log-probabilities of logits[S,V] (log_softmax of each row): chosen[S] (f32, =) that of tokens[s] (i32[S]);
// top_ids[S,n] (i32, =) and top_logprob[S,n] (f32, =) the n most likely tokens, most likely first (ties: lower id
// first), n in [0, 20] (n = 0: empty tensors).
void logprobs_rows(const Tensor& chosen, const Tensor& top_ids, const Tensor& top_logprob, const Tensor& logits,
                   const Tensor& tokens);

}  // namespace dscpp::ops
