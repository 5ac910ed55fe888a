// InferenceEngine: the model, the KV cache and the ragged state joined (include/dscpp/inference/engine.h).
#include "dscpp/inference/engine.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <functional>
#include <iomanip>
#include <map>

#include "dscpp/comm/peer_all_reduce.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/device_memory.h"
#include "inference/model/model_runner.h"
#include "inference/ragged/state_manager.h"
#include "inference/sampling/batch_sampler.h"
#include "inference/scheduler/splitfuse_scheduler.h"

namespace dscpp::inference {

namespace {

// Note [KV cache size]
// "reserve" gives the KV cache what the device can still hand out once the weights are loaded (on a GPU: free
// memory plus our allocator's unused cache; on the CPU: the host's available pages), less memory_config.size bytes
// kept back for the forward's activations and everything else. Measured here, after the weights, so a model that
// nearly fills the device gets a small cache or a refusal with the numbers, never an out-of-memory error later.
int64_t free_bytes_for_cache(Device d) {
  if (d.is_cuda()) return cuda_device_free_memory(d.index);
  return int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
}

// FastGen's rule: every tensor-parallel rank gets the fewest blocks any rank can hold, so the blocks rank 0's state
// manager hands out exist everywhere.
int64_t fewest_over_ranks(const TpShard& tp, int64_t n, Device d) {
  if (tp.size == 1) return n;
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = int32_t(std::min<int64_t>(n, INT32_MAX));
  Tensor x = d.is_cuda() ? t.to(d) : t;
  tp.group->all_reduce(x, ReduceOp::min)->wait();
  return (d.is_cuda() ? x.to(Device::cpu()) : x).data<int32_t>()[0];
}

KVCache make_cache(const InferenceModel& m, const InferenceConfig& c, std::ostream* log) {
  const int64_t bs = c.dscpp.kv_block_size;
  const DType kv = c.dscpp.kv_dtype(m.dtype);  // Note [fp8 KV cache]: bytes per token follow the cache's dtype
  const int64_t per_block = kv_cache_shape(m.cfg, 1, bs).bytes_per_block(kv);
  const bool reserve = c.state_manager.memory_config.mode == "reserve";
  const int64_t n_blocks = fewest_over_ranks(
      m.tp, kv_cache_blocks(c.state_manager, bs, per_block, reserve ? free_bytes_for_cache(m.device) : 0), m.device);
  if (log) {
    *log << "KV cache: " << n_blocks << " blocks of " << bs << " tokens = " << n_blocks * bs << " tokens ("
         << std::fixed << std::setprecision(2) << double(n_blocks * per_block) / double(1 << 30) << " GiB, "
         << dtype_name(kv);
    if (kv != m.dtype)
      *log << ": " << dtype_size(m.dtype) / dtype_size(kv) << "x the tokens of a " << dtype_name(m.dtype)
           << " cache in the same memory";
    *log << "); one sequence holds up to " << c.state_manager.max_context << " tokens" << std::endl;
  }
  return KVCache(kv_cache_shape(m.cfg, n_blocks, bs), kv, m.device);
}

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// FastGen's put returns the logits themselves, on the host, through pinned memory (a pageable copy of B rows of
// 128K logits ran at a fraction of the bus's speed).
Tensor on_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor host = empty_pinned(t.shape(), t.dtype());
  copy_async(host, t);
  cuda_synchronize(t.device().index);
  return host;
}

}  // namespace

// The scheduler's view of the engine: a forward, then each wanted row sampled on the logits' device by its
// request's sampler (BatchSampler: only the token ids come back).
class SampledModel : public TokenModel {
 public:
  SampledModel(ModelRunner& runner, KVCache& cache, BatchSampler& sampler,
               std::map<int64_t, SequenceSampler>& samplers, std::map<int64_t, SampleResult>& last,
               GenerationStats& stats)
      : runner_(runner), cache_(cache), sampler_(sampler), samplers_(samplers), last_(last), stats_(stats) {}
  std::vector<int32_t> next_tokens(const RaggedBatch& batch, const std::vector<int64_t>& uids,
                                   const std::vector<uint8_t>& wants_token) override {
    const auto t0 = Clock::now();
    const Tensor logits = runner_.forward(batch, cache_);
    const auto t1 = Clock::now();
    std::vector<SequenceSampler*> rows(uids.size(), nullptr);
    for (size_t s = 0; s < uids.size(); s++)
      if (wants_token[s]) rows[s] = &samplers_.at(uids[s]);
    std::vector<SampleResult> res = sampler_.sample(logits, rows);
    std::vector<int32_t> out(uids.size(), -1);
    for (size_t s = 0; s < uids.size(); s++) {
      if (!rows[s]) continue;
      out[s] = res[s].token;
      last_[uids[s]] = std::move(res[s]);
    }
    // The forward's time is the host's launch (all of it on the CPU) plus the wait for the
    // device's forward and sampling kernels; the sampler's host time is the rest of its call.
    const double wait = sampler_.last_wait_seconds();
    stats_.forward_seconds += seconds(t0, t1) + wait;
    stats_.sample_seconds += seconds(t1, Clock::now()) - wait;
    return out;
  }

 private:
  ModelRunner& runner_;
  KVCache& cache_;
  BatchSampler& sampler_;
  std::map<int64_t, SequenceSampler>& samplers_;
  std::map<int64_t, SampleResult>& last_;
  GenerationStats& stats_;
};

// What generate and the step API keep between steps.
struct Serving {
  Serving(ModelRunner& runner, KVCache& cache, StateManager& state)
      : sched(state), model(runner, cache, sampler, samplers, last, totals) {}
  SplitFuseScheduler sched;
  std::map<int64_t, SequenceSampler> samplers;
  std::map<int64_t, SampleResult> last;
  BatchSampler sampler;
  GenerationStats totals;
  SampledModel model;
};

namespace {

RunnerLimits runner_limits(const InferenceConfig& c) {
  const StateManagerConfig& sm = c.state_manager;
  const int64_t bs = c.dscpp.kv_block_size;
  return {sm.max_ragged_batch_size, sm.max_ragged_sequence_count, (sm.max_context + bs - 1) / bs,
          c.dscpp.cuda_graph_max_batch};
}

// What every rank of a tensor-parallel model must agree on (Note [Start-up agreement]): the engine's config key by
// key and the model's shape, dtype and device type.
Settings tp_settings(const InferenceModel& m, const InferenceConfig& c) {
  Settings s;
  const std::function<void(const std::string&, const nlohmann::json&)> flatten = [&](const std::string& k,
                                                                                   const nlohmann::json& v) {
    if (!v.is_object()) {
      s.emplace_back(k, v.dump());
      return;
    }
    for (const auto& [key, sub] : v.items()) flatten(k.empty() ? key : k + "." + key, sub);
  };
  flatten("", c.to_json());
  const InferenceModelConfig& f = m.cfg;
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"n_layer", f.n_layer}, {"n_head", f.n_head * m.tp.size}, {"n_kv_head", f.n_kv_head * m.tp.size},
           {"head_dim", f.head_dim}, {"hidden", f.hidden}, {"ffn", f.ffn * m.tp.size}, {"vocab", f.vocab},
           {"max_context", f.max_context}})
    s.emplace_back(std::string("model.") + k, std::to_string(v));
  s.emplace_back("model.model_type", f.model_type);
  s.emplace_back("model.dtype", dtype_name(m.dtype));
  s.emplace_back("model.device", m.device.is_cuda() ? "cuda" : "cpu");
  return s;
}

// m checked against the config (and a tensor-parallel group's ranks against each other), its gate | up rows and its
// q and k heads put in the layouts the engine's forward takes (Note [SwiGLU in the decode GEMV], Note [Rope and KV
// append in the decode GEMV]).
InferenceModel& prepared(InferenceModel& m, const InferenceConfig& c) {
  DSCPP_CHECK(c.state_manager.max_context <= m.cfg.max_context || m.cfg.max_context == 0,
              "state_manager.max_context = ", c.state_manager.max_context, " exceeds the model's ", m.cfg.max_context,
              " positions: lower it to at most ", m.cfg.max_context);
  DSCPP_CHECK(c.tp_size == m.tp.size, "tensor_parallel.tp_size = ", c.tp_size, " but the model was loaded as ",
              m.tp.size == 1 ? "a whole (no tensor-parallel group)" : "a shard of " + std::to_string(m.tp.size),
              ": load it with a group of tp_size ranks (LoadOptions::tp_group)");
  if (m.tp.size > 1) check_same_settings(*m.tp.group, *m.tp.group->store(), tp_settings(m, c));
  interleave_gate_up(m);
  pair_rope_rows(m);
  return m;
}

// A tensor-parallel model's small all-reduces over GPU peer memory, when every rank can map the others' (a
// collective, after the start-up agreement); m's shard then uses it.
std::unique_ptr<PeerAllReduce> peer_all_reduce(InferenceModel& m, const InferenceConfig& c, std::ostream* log) {
  const int64_t bytes = c.dscpp.peer_all_reduce_max_bytes;
  if (m.tp.size == 1 || !m.device.is_cuda() || bytes == 0) return nullptr;
  std::string why;
  std::unique_ptr<PeerAllReduce> p = PeerAllReduce::create(*m.tp.group, bytes, &why);
  m.tp.peer = p.get();
  if (log)
    *log << "tensor parallelism over " << m.tp.size << " GPUs: "
         << (p ? "all-reduces of up to " + std::to_string(bytes) + " bytes over peer memory, larger ones on NCCL"
               : "every all-reduce on NCCL (peer memory: " + why + ")")
         << std::endl;
  return p;
}

}  // namespace

InferenceEngine::InferenceEngine(InferenceModel model, const InferenceConfig& config, std::ostream* log)
    : model_(std::move(model)),
      config_(config),
      peer_(peer_all_reduce(prepared(model_, config_), config_, log)),
      runner_(std::make_unique<ModelRunner>(model_, runner_limits(config_))),
      cache_(make_cache(model_, config_, log)) {
  state_ = std::make_unique<StateManager>(config_.state_manager, int32_t(cache_.shape().n_blocks),
                                          config_.dscpp.kv_block_size, config_.dscpp.prefix_caching);
  serving_ = std::make_unique<Serving>(*runner_, cache_, *state_);
  const double s = runner_->capture_graphs(cache_);
  runner_->open_steps();
  if (log && !runner_->graph_buckets().empty())
    *log << "CUDA graphs: " << runner_->graph_buckets().size() << " decode batch sizes (1 to "
         << runner_->graph_buckets().back() << " sequences, " << runner_->graph_nodes() << " kernels) captured in "
         << std::fixed << std::setprecision(2) << s << " s" << std::endl;
}

InferenceEngine::~InferenceEngine() {
  // Rank 0's end is the followers' (Note [Tensor-parallel steps]). An engine dropped by an exception sends nothing:
  // the group's abort stops them. A stop that fails finds the group broken, the followers failing already.
  if (std::uncaught_exceptions() > 0) return;
  try {
    runner_->stop_followers();
  } catch (const std::exception&) {
  }
}

void InferenceEngine::follow() {
  DSCPP_CHECK(model_.tp.rank > 0, "InferenceEngine::follow: rank 0 of a tensor-parallel model (or a whole model) "
              "leads; only ranks 1.. follow");
  while (runner_->follow(cache_)) {
  }
}

void InferenceEngine::check_tokens(const std::vector<int64_t>& uids,
                                   const std::vector<std::vector<int32_t>>& tokens) const {
  DSCPP_CHECK(uids.size() == tokens.size(), "put: ", uids.size(), " uids but ", tokens.size(), " token lists");
  const int64_t V = model_.cfg.vocab;
  for (size_t i = 0; i < tokens.size(); i++)
    for (int32_t t : tokens[i])
      DSCPP_CHECK(t >= 0 && t < V, "sequence ", uids[i], ": token id ", t, " is outside the model's vocabulary [0, ",
                  V, ")");
}

Tensor InferenceEngine::put(const std::vector<int64_t>& uids, const std::vector<std::vector<int32_t>>& tokens) {
  check_tokens(uids, tokens);
  const RaggedBatch& batch = state_->put(uids, tokens);
  Tensor logits;
  try {
    logits = on_host(runner_->forward(batch, cache_));
  } catch (...) {
    // The forward wrote part of the new tokens' K/V at most; those slots are past every sequence's seen tokens, so
    // dropping the put leaves each sequence as it was.
    state_->abort_forward();
    throw;
  }
  state_->post_forward();
  return logits;
}

SchedulingResult InferenceEngine::can_schedule(const std::vector<int64_t>& uids,
                                               const std::vector<int64_t>& lengths) const {
  return state_->can_schedule(uids, lengths);
}

std::pair<int64_t, int64_t> InferenceEngine::query(int64_t uid, int64_t max_request_tokens,
                                                   int64_t max_request_blocks) const {
  return state_->query(uid, max_request_tokens, max_request_blocks);
}

int64_t InferenceEngine::get_remaining_block_capacity(int64_t uid) const {
  return state_->get_remaining_block_capacity(uid);
}

void InferenceEngine::flush(int64_t uid) { state_->flush(uid); }

void InferenceEngine::submit(const GenerationRequest& g) {
  g.sampling.validate();
  check_tokens({g.request.uid}, {g.request.prompt});
  Request r = g.request;
  r.stop_token_ids.insert(r.stop_token_ids.end(), g.sampling.stop_token_ids.begin(), g.sampling.stop_token_ids.end());
  SequenceSampler sampler(g.sampling, r.prompt);
  const int64_t uid = r.uid;
  serving_->sched.add(std::move(r));  // throws (uid in use, too long, ...) before anything is kept
  serving_->samplers.insert_or_assign(uid, std::move(sampler));
}

bool InferenceEngine::cancel(int64_t uid) {
  serving_->samplers.erase(uid);
  serving_->last.erase(uid);
  return serving_->sched.cancel(uid);
}

void InferenceEngine::step(const std::function<void(const GeneratedToken&)>& on_token) {
  Serving& sv = *serving_;
  GenerationStats& st = sv.totals;
  const int64_t replays0 = runner_->graph_replays();
  const auto t0 = Clock::now();
  try {
    for (const TokenEvent& e : sv.sched.step(sv.model)) {
      st.generated++;
      auto last = sv.last.find(e.uid);
      const GeneratedToken t{e, last != sv.last.end() ? std::move(last->second) : SampleResult{}};
      if (e.finished != FinishReason::none) sv.samplers.erase(e.uid), sv.last.erase(e.uid);
      on_token(t);
    }
  } catch (...) {
    // The step's forward may have been cut short and the scheduler's plan with it: nothing of it is kept.
    if (state_->batch_in_flight()) state_->abort_forward();
    for (int64_t uid : sv.sched.uids()) cancel(uid);
    throw;
  }
  st.forwards++;
  st.forward_tokens += sv.sched.last_step().tokens;
  st.preemptions = sv.sched.total_preemptions();
  st.graph_replays += runner_->graph_replays() - replays0;
  st.seconds += seconds(t0, Clock::now());
}

bool InferenceEngine::idle() const { return serving_->sched.idle(); }
int64_t InferenceEngine::n_running() const { return serving_->sched.n_running(); }
int64_t InferenceEngine::n_waiting() const { return serving_->sched.n_waiting(); }
const GenerationStats& InferenceEngine::totals() const { return serving_->totals; }

GenerationStats InferenceEngine::generate(const std::vector<GenerationRequest>& requests,
                                          const std::function<void(const GeneratedToken&)>& on_token) {
  DSCPP_CHECK(idle(), "generate: the engine is serving ", n_running() + n_waiting(), " requests already");
  const GenerationStats before = totals();
  try {
    for (const auto& g : requests) submit(g);
    while (!idle()) step(on_token);
  } catch (...) {
    for (int64_t uid : serving_->sched.uids()) cancel(uid);  // a refused submit: the ones queued before it
    throw;
  }
  const GenerationStats& after = totals();
  GenerationStats st;
  st.forwards = after.forwards - before.forwards;
  st.forward_tokens = after.forward_tokens - before.forward_tokens;
  st.generated = after.generated - before.generated;
  st.preemptions = after.preemptions - before.preemptions;
  st.seconds = after.seconds - before.seconds;
  st.forward_seconds = after.forward_seconds - before.forward_seconds;
  st.sample_seconds = after.sample_seconds - before.sample_seconds;
  st.graph_replays = after.graph_replays - before.graph_replays;
  return st;
}

}  // namespace dscpp::inference
