// Pipeline schedules (Note [Pipeline schedules] in schedule.h).
#include "runtime/pipe/schedule.h"

#include <algorithm>
#include <set>
#include <utility>

#include "dscpp/core/check.h"

namespace dscpp {

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::load_micro_batch: return "load_micro_batch";
    case PipeOp::forward: return "forward";
    case PipeOp::backward: return "backward";
    case PipeOp::send_activation: return "send_activation";
    case PipeOp::recv_activation: return "recv_activation";
    case PipeOp::send_grad: return "send_grad";
    case PipeOp::recv_grad: return "recv_grad";
    case PipeOp::reduce_tied_grads: return "reduce_tied_grads";
    case PipeOp::optimizer_step: return "optimizer_step";
  }
  return "?";
}

std::string to_string(const PipeInstr& i) {
  std::string s = pipe_op_name(i.op);
  if (i.mb >= 0) s += "(mb " + std::to_string(i.mb) + ", chunk " + std::to_string(i.chunk) + ")";
  if (i.peer >= 0) s += " peer " + std::to_string(i.peer);
  return s;
}

void PipeShape::validate() const {
  DSCPP_CHECK(stages >= 1 && micro_batches >= 1 && virtual_stages >= 1, "pipeline: stages (", stages,
              "), micro-batches (gradient_accumulation_steps ", micro_batches, ") and virtual stages (",
              virtual_stages, ") must be >= 1");
  DSCPP_CHECK(virtual_stages == 1 || micro_batches % stages == 0, "pipeline: interleaving (dscpp.pipeline."
              "virtual_stages ", virtual_stages, ") needs the micro-batches (gradient_accumulation_steps ",
              micro_batches, ") to be a multiple of the pipeline stages (", stages, ")");
}

std::vector<PipeCompute> compute_order(const PipeShape& s, int stage, bool train) {
  s.validate();
  DSCPP_CHECK(stage >= 0 && stage < s.stages, "pipeline stage ", stage, " outside [0, ", s.stages, ")");
  const int p = s.stages, v = s.virtual_stages, m = s.micro_batches, total = m * v;
  // The k-th forward (backward) of this rank: micro-batches in groups of p, each group through every chunk.
  auto at = [&](int k, bool forward) {
    const int group = k / (p * v), within = k % (p * v), c = within / p;
    return PipeCompute{forward, group * p + within % p, forward ? c : v - 1 - c};
  };
  std::vector<PipeCompute> out;
  if (!train) {
    for (int k = 0; k < total; k++) out.push_back(v == 1 ? PipeCompute{true, k, 0} : at(k, true));
    return out;
  }
  const int warmup = std::min(total, v == 1 ? p - stage - 1 : (p - stage - 1) * 2 + (v - 1) * p);
  for (int k = 0; k < warmup; k++) out.push_back(at(k, true));
  for (int k = 0; k + warmup < total; k++) {
    out.push_back(at(k + warmup, true));
    out.push_back(at(k, false));
  }
  for (int k = total - warmup; k < total; k++) out.push_back(at(k, false));
  return out;
}

std::vector<std::vector<PipeInstr>> build_schedule(const PipeShape& s, bool train) {
  s.validate();
  const int p = s.stages, V = p * s.virtual_stages, m = s.micro_batches;
  const size_t P = size_t(p);
  std::vector<std::vector<PipeCompute>> order;
  for (int r = 0; r < p; r++) order.push_back(compute_order(s, r, train));
  std::vector<std::vector<PipeInstr>> out(P);
  // Completion slot of each virtual stage's forward / backward of each micro-batch (-1: not yet).
  std::vector<std::vector<int64_t>> fwd_done(static_cast<size_t>(V), std::vector<int64_t>(static_cast<size_t>(m), -1));
  auto bwd_done = fwd_done;
  std::vector<size_t> pc(P, 0);
  std::vector<std::set<int>> loaded(P);
  auto finished = [&](int64_t slot, int64_t t) { return slot >= 0 && slot <= t; };
  size_t left = 0;
  for (const auto& o : order) left += o.size();
  // Every compute takes one slot, so every rank is free at each slot's start: first the messages of the computes
  // that start now (both ends free), then the computes.
  for (int64_t t = 0; left > 0; t++) {
    std::vector<int> ready;
    for (int r = 0; r < p; r++) {
      if (pc[size_t(r)] == order[size_t(r)].size()) continue;
      const PipeCompute c = order[size_t(r)][pc[size_t(r)]];
      const int vs = c.chunk * p + r;
      const int64_t input = c.forward ? (vs > 0 ? fwd_done[size_t(vs - 1)][size_t(c.mb)] : 0)
                                      : (vs == V - 1 ? fwd_done[size_t(vs)][size_t(c.mb)]
                                                     : bwd_done[size_t(vs + 1)][size_t(c.mb)]);
      if (finished(input, t)) ready.push_back(r);
    }
    DSCPP_CHECK(!ready.empty(), "pipeline schedule: the compute orders of ", p, " stages x ", s.virtual_stages,
                " chunks, ", m, " micro-batches cannot proceed at slot ", t);
    for (int r : ready) {
      const PipeCompute c = order[size_t(r)][pc[size_t(r)]];
      const int vs = c.chunk * p + r, from = c.forward ? vs - 1 : vs + 1, q = from % p;
      if (from < 0 || from >= V || q == r) continue;
      out[size_t(q)].push_back({c.forward ? PipeOp::send_activation : PipeOp::send_grad, c.mb, from / p, r});
      out[size_t(r)].push_back({c.forward ? PipeOp::recv_activation : PipeOp::recv_grad, c.mb, c.chunk, q});
    }
    for (int r : ready) {
      const PipeCompute c = order[size_t(r)][pc[size_t(r)]++];
      const int vs = c.chunk * p + r;
      auto& list = out[size_t(r)];
      if (c.forward && (vs == 0 || vs == V - 1) && loaded[size_t(r)].insert(c.mb).second)
        list.push_back({PipeOp::load_micro_batch, c.mb, c.chunk, -1});
      list.push_back({c.forward ? PipeOp::forward : PipeOp::backward, c.mb, c.chunk, -1});
      (c.forward ? fwd_done : bwd_done)[size_t(vs)][size_t(c.mb)] = t + 1;
      left--;
    }
  }
  if (train)
    for (auto& list : out) {
      list.push_back({PipeOp::reduce_tied_grads, -1, 0, -1});
      list.push_back({PipeOp::optimizer_step, -1, 0, -1});
    }
  return out;
}

}  // namespace dscpp
