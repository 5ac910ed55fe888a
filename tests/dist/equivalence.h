// "N ranks equal one process": the distributed-equivalence harness (habit 19). A DistCase names a backend (gloo: CPU
// ranks; nccl: one GPU per rank), a world size, a ZeRO stage, a model and the config variants that change how the
// gradients travel. run_equivalence() trains it on `world` forked ranks and, in each rank, the one-process reference:
// stage 0 with the same global batch (gradient accumulation over all world * gas micro-batches), no
// communication_data_type, no copy engines, unfused head. Each rank then compares its step-0 averaged gradients (the
// elements it owns), every step's loss and gradient norm, and the final parameters with the reference's, within
// Note [Equivalence tolerances], and checks what the case says about the gradient sync's counters.
//
// Note [Equivalence tolerances]: both sides run the same kernels on the same micro-batches, so each micro-batch's
// gradient is the same up to an exact power-of-two scale (1/gas against 1/(world * gas)); they differ only in how the
// S = world * gas micro-batch gradients are summed (locally, then by the collective, against one accumulation).
// Summing S terms in another order moves the sum by about u * sqrt(S) times its terms' scale (the roundings add like a
// random walk), u the unit roundoff of the dtype the sum is held in: f32, or communication_data_type, which rounds
// each rank's sum before the average (S = world summands then). A bf16 model rounds its parameters after each step,
// and a master within an f32 rounding of a bf16 boundary lands one bf16 ulp away, so what follows the first step
// takes the model dtype's u. Every step carries the earlier steps' error on, so the bound grows with their count:
//   bound = kHeadroom * u * sqrt(summands) * steps * scale,  scale: the reference's largest magnitude of the quantity.
// Parameters add the rounding of each step's update (u of the parameter dtype times |p|). The optimizer is SGD with
// momentum and weight decay (clipping engaged): its update is linear in the gradient, so the update's relative error
// is the gradients'. (Adam's normalised update is not: a gradient element near zero whose sign the summation order
// flips moves by 2 lr, which no such bound covers.) A wrong shard, a stale gather, a missed or doubled average move
// results by about scale / world, orders of magnitude past the bound.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dist/multiprocess.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#include "runtime/dp/grad_sync.h"
#include "tiny_models.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"  // set_matmul_allow_tf32
#endif

namespace dscpp::test {

constexpr double kHeadroom = 8;  // for the tails of the rounding errors' distribution

struct DistCase {
  std::string backend = "gloo";  // gloo: CPU ranks; nccl: rank r on cuda:r
  int world = 2;
  int stage = 0;
  std::string arch = "gpt2";     // gpt2: tied head; llama: GQA, untied head
  int64_t gas = 2;
  std::string optimizer = "sgd";  // sgd (momentum, weight decay: Note [Equivalence tolerances]), adamw, lion, adagrad
  std::string precision = "f32";  // f32; fp16: the fp16 engine path (loss scaler, f32 masters) on the f32 model;
                                  // bf16: a bf16 model (CUDA)
  std::string comm;               // communication_data_type ("" = the gradients' f32)
  std::optional<bool> overlap;    // overlap_comm as written (unset: DeepSpeed's default, true only at stage 3)
  int64_t bucket = 3000;          // reduce_bucket_size (stage 0)
  bool copy_engine = false;       // dscpp.copy_engine.enabled (Gloo: EngineOptions::copy_engine_over_gloo)
  std::optional<int64_t> arena_mib;  // dscpp.copy_engine.arena_mib
  bool fused_head = false;        // dscpp.fused_head (the reference stays unfused)
  bool sequence_parallel = false;  // dscpp.sequence_parallel (tensor-parallel cases; the reference has none)
  bool sharded_init = false;      // stage 3: each rank initialises only its shard (EngineOptions::init_seed)
  bool checkpointing = true;      // activation checkpointing of every block
  bool gather16 = false;          // stage3_gather_16bit_weights_on_model_save
  int64_t n_layer = 0;            // 0: the tiny model's
  int64_t prefetch = 50000000, persistence = 100000, reuse = 1000000000, max_live = 1000000000;  // stage 3
  double offload = 0;             // zero_optimization.offload_optimizer: device "cpu" with this ratio (0: none)
  int64_t offload_buffers = 4;    // and this buffer_count
  bool delayed_update = false;    // dscpp.offload.delayed_update
  std::string nvme_path;          // set: offload_optimizer.device "nvme" there (no disk probe)
  bool pipeline_read = false, pipeline_write = false;  // offload_optimizer.pipeline_* (nvme)
  int64_t sub_group = 0;          // zero_optimization.sub_group_size (0: the default)
  std::string aio_backend;        // dscpp.offload.aio_backend ("": the default, auto)
  bool offload_param = false;     // zero_optimization.offload_param: device "cpu" (stage 3)
  bool pin_param = true;          // and its pin_memory (false: staged through page-locked buffers)
  int64_t param_buffer_size = 100000000;  // and its buffer_size
  std::string param_nvme_path;    // set: offload_param.device "nvme" there instead of "cpu"

  bool gpu() const { return backend == "nccl"; }
  std::string name() const {  // a gtest parameter name
    std::ostringstream o;
    o << arch << "_w" << world << "_s" << stage << "_gas" << gas;
    if (optimizer != "sgd") o << "_" << optimizer;
    if (precision != "f32") o << "_" << precision;
    if (!comm.empty()) o << "_comm" << comm;
    if (overlap) o << (*overlap ? "_overlap" : "_nooverlap");
    if (stage == 0) o << "_bucket" << bucket;
    if (copy_engine) o << "_copies";
    if (arena_mib) o << "_arena" << *arena_mib;
    if (fused_head) o << "_fused";
    if (sequence_parallel) o << "_sp";
    if (sharded_init) o << "_shardedinit";
    if (n_layer) o << "_L" << n_layer;
    if (stage == 3 && reuse == 0) o << "_noreuse";
    if (offload > 0) o << "_offload" << int(offload * 100);
    if (offload > 0 && offload_buffers != 4) o << "_buffers" << offload_buffers;
    if (delayed_update) o << "_dpu";
    if (!nvme_path.empty()) o << "_nvme" << (pipeline_read ? "_pr" : "") << (pipeline_write ? "_pw" : "");
    if (sub_group) o << "_sg" << sub_group;
    if (!aio_backend.empty()) o << "_" << aio_backend;
    if (offload_param) o << "_offparam" << (!param_nvme_path.empty() ? "_nvme" : pin_param ? "_pinned" : "_pageable");
    if (offload_param && param_buffer_size != 100000000) o << "_staging" << param_buffer_size;
    return o.str();
  }
};

// A case on `world` ranks at `stage`, the rest as `more` sets it.
inline DistCase dist_case(int world, int stage, const std::string& arch,
                          const std::function<void(DistCase&)>& more = nullptr) {
  DistCase c;
  c.world = world;
  c.stage = stage;
  c.arch = arch;
  if (more) more(c);
  return c;
}

inline void PrintTo(const DistCase& c, std::ostream* os) { *os << c.backend << " " << c.name(); }  // gtest's name

inline int64_t batch(const DistCase&) { return 2; }
inline int64_t seq(const DistCase& c) { return c.gpu() ? 32 : 8; }

inline ModelConfig model_config(const DistCase& c) {
  ModelConfig m = test_fixtures::tiny_model_config(c.arch);
  if (c.gpu()) {  // head dim 64: the flash-attention path in 16-bit
    m.n_embd = 128;
    m.n_head = 2;
    m.n_kv_head = c.arch == "gpt2" ? 2 : 1;
    m.n_ffn = c.arch == "gpt2" ? 512 : 352;
    m.vocab_size = 251;
    m.max_seq_len = 64;
  }
  if (c.n_layer) m.n_layer = c.n_layer;
  return m;
}

inline std::string config_json(const DistCase& c) {
  std::ostringstream j;
  j << R"({"train_micro_batch_size_per_gpu": )" << batch(c) << R"(, "gradient_accumulation_steps": )" << c.gas;
  if (c.optimizer == "sgd")  // clipping at 0.05 engages on every step (checked): the norms are ~1
    j << R"(, "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.1}})";
  else if (c.optimizer == "lion")
    j << R"(, "optimizer": {"type": "Lion", "params": {"lr": 0.001, "betas": [0.9, 0.99], "weight_decay": 0.1}})";
  else if (c.optimizer == "adagrad")
    j << R"(, "optimizer": {"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 0.01}})";
  else
    j << R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  j << R"(, "gradient_clipping": 0.05,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear"}})";
  if (c.precision == "fp16") j << R"(, "fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 1})";
  if (c.precision == "bf16") j << R"(, "bf16": {"enabled": true})";
  if (c.checkpointing)
    j << R"(, "activation_checkpointing": {"number_checkpoints": )" << model_config(c).n_layer << "}";
  if (!c.comm.empty()) j << R"(, "communication_data_type": ")" << c.comm << '"';
  j << R"(, "dscpp": {"fused_head": )" << (c.fused_head ? "true" : "false") << R"(, "sequence_parallel": )"
    << (c.sequence_parallel ? "true" : "false")
    << R"(, "copy_engine": {"enabled": )"
    << (c.copy_engine ? "true" : "false");
  if (c.arena_mib) j << R"(, "arena_mib": )" << *c.arena_mib;
  j << R"(}, "offload": {"delayed_update": )" << (c.delayed_update ? "true" : "false");
  if (!c.nvme_path.empty()) j << R"(, "nvme_probe_mib": 0)";
  if (!c.aio_backend.empty()) j << R"(, "aio_backend": ")" << c.aio_backend << '"';
  j << R"(}}, "zero_optimization": {"stage": )" << c.stage;
  if (c.offload > 0) {
    j << R"(, "offload_optimizer": {"device": ")" << (c.nvme_path.empty() ? "cpu" : "nvme") << R"(", "ratio": )"
      << c.offload << R"(, "buffer_count": )" << c.offload_buffers;
    if (!c.nvme_path.empty())
      j << R"(, "nvme_path": ")" << c.nvme_path << R"(", "pipeline_read": )" << (c.pipeline_read ? "true" : "false")
        << R"(, "pipeline_write": )" << (c.pipeline_write ? "true" : "false");
    j << "}";
  }
  if (c.sub_group) j << R"(, "sub_group_size": )" << c.sub_group;
  if (c.offload_param)
    j << R"(, "offload_param": {"device": ")" << (c.param_nvme_path.empty() ? "cpu" : "nvme") << R"(", "pin_memory": )"
      << (c.pin_param ? "true" : "false") << R"(, "buffer_size": )" << c.param_buffer_size
      << (c.param_nvme_path.empty() ? "" : R"(, "nvme_path": ")" + c.param_nvme_path + '"') << "}";
  if (c.overlap) j << R"(, "overlap_comm": )" << (*c.overlap ? "true" : "false");
  j << R"(, "reduce_bucket_size": )" << c.bucket << R"(, "stage3_prefetch_bucket_size": )" << c.prefetch
    << R"(, "stage3_param_persistence_threshold": )" << c.persistence << R"(, "stage3_max_reuse_distance": )"
    << c.reuse << R"(, "stage3_max_live_parameters": )" << c.max_live
    << R"(, "stage3_gather_16bit_weights_on_model_save": )" << (c.gather16 ? "true" : "false") << "}}";
  return j.str();
}

// The case's engine on this rank (pg null: one process), on cuda:`device` for nccl cases.
inline std::unique_ptr<Engine> make_engine(const DistCase& c, ProcessGroup* pg, int device = 0) {
  const int world = pg ? pg->size() : 1;
  DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(c), world);
  ModelOptions mo;
  mo.dtype = c.precision == "bf16" ? DType::bf16 : DType::f32;
  if (c.gpu()) mo.device = Device::cuda(device);
  mo.pad_multiple = 16 * world;                              // units split evenly across the ranks
  mo.allocate_grads = !(c.stage >= 2 && world > 1);          // stage 2/3 across ranks: per-unit windows
  mo.materialize_params = !c.sharded_init;
  auto m = make_model(model_config(c), mo);
  if (!c.sharded_init) m->init_weights(42);
  EngineOptions o;
  o.dp_group = pg;
  if (c.sharded_init) o.init_seed = 42;
  o.mixed_precision_on_f32_model = c.precision == "fp16";
  o.copy_engine_over_gloo = c.copy_engine && !c.gpu();
  return initialize(std::move(m), cfg, o);
}

// Micro-batch j of step s: [B, T] tokens and next-token targets, the same stream in every process.
inline void micro_batch(const DistCase& c, int64_t s, int64_t j, Tensor& x, Tensor& y) {
  Rng rng(RngState{4242, uint64_t(s * 1000 + j) << 20, 4});
  const uint32_t vocab = uint32_t(model_config(c).vocab_size);
  for (int64_t i = 0; i < x.numel(); i++) {
    x.data<int32_t>()[i] = int32_t(rng.next_u32() % vocab);
    y.data<int32_t>()[i] = int32_t(rng.next_u32() % vocab);
  }
}

// Flat (padded, rank-dependent) layout -> named layout: the parameters in declaration order without padding.
inline std::vector<float> named(const ParamSet& ps, const Tensor& flat) {
  Tensor f = flat.to(Device::cpu()).to(DType::f32);
  std::vector<float> out;
  for (const ParamInfo& p : ps.infos())
    out.insert(out.end(), f.data<float>() + p.offset, f.data<float>() + p.offset + p.numel);
  return out;
}
inline std::vector<float> named_params(Engine& e) {  // a collective at stage 3
  return named(e.model().params(), e.gather_full_params());
}
// This rank's averaged gradients in the named layout (zero where another rank owns them), and which are its own.
inline std::pair<std::vector<float>, std::vector<bool>> named_owned_grads(Engine& e) {
  const ParamSet& ps = e.model().params();
  Tensor flat = Tensor::zeros({ps.flat_numel()}, DType::f32), owned = Tensor::zeros({ps.flat_numel()}, DType::f32);
  for (size_t k = 0; k < e.owned_ranges().size(); k++) {
    const FlatRange r = e.owned_ranges()[k];
    Tensor dst = flat.slice(r.begin, r.size());
    dst.copy_from(e.owned_grads(k).to(Device::cpu()));
    owned.slice(r.begin, r.size()).fill(1.0f);
  }
  std::vector<bool> mine;
  for (float m : named(ps, owned)) mine.push_back(m != 0.0f);
  return {named(ps, flat), mine};
}

struct Trained {
  std::vector<float> init, params, grads;  // named; grads: step 0's averaged gradients (those of `mine`)
  std::vector<bool> mine;                  // the elements whose gradients this rank owns
  std::vector<float> losses, norms;        // per step: the loss averaged over the ranks, the norm before clipping
};

// Rank r of W takes micro-batches j = r*gas + m of each step, so the W ranks together cover j in [0, W*gas).
inline Trained train(Engine& e, const DistCase& c, int rank, int64_t gas, int64_t steps = 3, int64_t first_step = 0) {
  Tensor x = Tensor::empty({batch(c), seq(c)}, DType::i32), y = Tensor::empty({batch(c), seq(c)}, DType::i32);
  Trained out;
  out.init = named_params(e);
  for (int64_t s = first_step; s < first_step + steps; s++) {
    for (int64_t m = 0; m < gas; m++) {
      micro_batch(c, s, rank * gas + m, x, y);
      e.forward(x, y);
      e.backward();
      if (s == first_step && m == gas - 1) std::tie(out.grads, out.mine) = named_owned_grads(e);
      e.step();
    }
    out.norms.push_back(float(e.last_grad_norm()));
    out.losses.push_back(e.global_last_loss());
  }
  out.params = named_params(e);
  return out;
}

inline double unit_roundoff(const std::string& dtype) {
  return dtype == "bf16" ? std::ldexp(1.0, -8) : dtype == "fp16" ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}
// Note [Equivalence tolerances]: the rounding error of a quantity of magnitude `scale` after `steps` steps.
inline double rounding_bound(double u, double summands, int64_t steps, double scale) {
  return kHeadroom * u * std::sqrt(summands) * double(steps) * std::fabs(scale);
}
inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Every element within bound(i) (where `mine`, when given, is true); fails on a non-finite value, naming the worst
// element and its share of the bound.
inline void expect_within(const std::vector<float>& got, const std::vector<float>& want,
                          const std::function<double(size_t)>& bound, const std::string& what,
                          const std::vector<bool>& mine = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = -1;
  size_t at = 0, compared = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!mine.empty() && !mine[i]) continue;  // another rank's
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i];
    const double share = std::fabs(double(got[i]) - double(want[i])) / bound(i);
    if (share > worst) worst = share, at = i;
    compared++;
  }
  ASSERT_GT(compared, 0u) << what << ": nothing to compare";
  EXPECT_LE(worst, 1.0) << what << ": element " << at << " is " << got[at] << ", the reference " << want[at]
                        << ": off by " << worst << " of the bound " << bound(at);
}

// The one-process reference of a case: stage 0, the global batch, f32 communication, NCCL kernels, unfused.
inline DistCase reference_case(DistCase c) {
  c.gas *= c.world;
  c.world = 1;
  c.stage = 0;
  c.comm.clear();
  c.copy_engine = false;
  c.arena_mib.reset();
  c.fused_head = false;
  c.sequence_parallel = false;
  c.sharded_init = false;
  c.offload = 0;
  c.delayed_update = false;
  c.offload_param = false;
  return c;
}

// Note [Equivalence tolerances]
inline void expect_equivalent(const Trained& got, const Trained& want, const DistCase& c, const std::string& what) {
  const int64_t steps = int64_t(want.losses.size());
  const double S = double(c.world * c.gas);
  const double u_sum = c.comm.empty() ? unit_roundoff("f32") : unit_roundoff(c.comm);
  const double n_sum = c.comm.empty() ? S : double(c.world);
  const double u_model = unit_roundoff(c.precision == "bf16" ? "bf16" : "f32");
  const double u_after = std::max(u_sum, u_model);
  const double g_bound = rounding_bound(u_sum, n_sum, 1, max_abs(want.grads));
  expect_within(got.grads, want.grads, [&](size_t) { return g_bound; }, what + ": step-0 averaged gradients",
                got.mine);
  if (!c.comm.empty()) {  // the 16-bit path was taken: the roundings show somewhere
    size_t differ = 0;
    for (size_t i = 0; i < got.grads.size(); i++) differ += got.mine[i] && got.grads[i] != want.grads[i];
    EXPECT_GT(differ, 0u) << what << ": gradients identical to f32 averaging, no " << c.comm << " on the wire";
  }
  // Step 0 runs on the same parameters; later steps carry the parameters' differences (the model dtype's roundings).
  auto per_step = [&](const std::vector<float>& ref) {
    return [&](size_t s) { return rounding_bound(s == 0 ? u_sum : u_after, n_sum, int64_t(s) + 1, ref[s]); };
  };
  expect_within(got.norms, want.norms, per_step(want.norms), what + ": gradient norms");
  expect_within(got.losses, want.losses, per_step(want.losses), what + ": losses");
  ASSERT_EQ(got.init, want.init) << what << ": the runs start from different parameters";
  std::vector<float> update(want.params.size());
  for (size_t i = 0; i < update.size(); i++) update[i] = want.params[i] - want.init[i];
  const double u_bound = rounding_bound(u_after, n_sum, steps, max_abs(update));
  expect_within(got.params, want.params,
                [&](size_t i) { return u_bound + kHeadroom * u_model * double(steps) * std::fabs(want.params[i]); },
                what + ": parameters after " + std::to_string(steps) + " steps");
}

// What the case says about the gradient sync and the stage-3 gathers, after training `steps` steps.
inline void expect_sync_counters(Engine& e, const DistCase& c, int64_t steps) {
  EXPECT_EQ(e.zero_partition().sharded(), c.stage > 0 && c.world > 1);
  const GradSync* g = e.grad_sync();
  if (c.world == 1) {
    EXPECT_EQ(g, nullptr);
    return;
  }
  ASSERT_NE(g, nullptr);
  const int64_t ranges = int64_t(g->plan().size());
  const bool overlap = c.overlap.value_or(c.stage == 3);
  // With overlap_comm every range goes out during backward; without it stages 0-1 wait for its end, while stages 2-3
  // still launch each unit as it becomes ready (Note [Gradient sync]).
  EXPECT_EQ(g->launched_early(), overlap || c.stage >= 2 ? ranges : 0);
  const int64_t per_step = c.stage >= 2 ? c.gas : 1;
  EXPECT_EQ(g->reductions(), ranges * per_step * steps);
  const bool budget = !c.arena_mib || *c.arena_mib > 0;
  int64_t copyable = 0;
  for (size_t k = 0; k < g->plan().size(); k++)
    copyable += c.comm.empty() && g->plan()[k].size() % c.world == 0 && !(c.stage == 0 && k == 0);
  if (c.copy_engine && budget) {
    EXPECT_GT(copyable, 0);
    EXPECT_EQ(g->reductions_by_copies(), copyable * per_step * steps) << "Note [Copy-engine reductions]";
    EXPECT_LE(g->arena().peak_used(), g->arena().capacity());
    EXPECT_NE(e.model_state_report().find("copy-engine buffers"), std::string::npos) << e.model_state_report();
  } else {
    EXPECT_EQ(g->reductions_by_copies(), 0);
    EXPECT_EQ(g->arena().capacity(), 0);
    EXPECT_EQ(e.model_state_report().find("copy-engine buffers"), std::string::npos) << e.model_state_report();
  }
  if (c.stage == 3) {
    const ZeroParamCoordinator* z = e.zero_params();
    ASSERT_NE(z, nullptr);
    EXPECT_GT(z->gathers(), 0);
    if (!c.copy_engine || !budget) {
      EXPECT_EQ(z->gathers_by_copies(), 0);
    } else if (c.reuse == 0) {
      EXPECT_EQ(z->gathers_by_copies(), z->gathers()) << "released after each use: all fit";
    } else {
      EXPECT_GT(z->gathers_by_copies(), 0);
      if (z->peak_live_elements() > z->arena().capacity()) {
        EXPECT_LT(z->gathers_by_copies(), z->gathers()) << "kept for reuse beyond the arena: some fall back";
      }
    }
  }
}

// Every rank holds rank 0's bits (stage 0 replicas; stages 1-3 after their gathers).
inline void expect_same_on_every_rank(ProcessGroup& pg, const std::vector<float>& mine, Device device) {
  Tensor t = Tensor::empty({int64_t(mine.size())}, DType::f32);
  std::copy(mine.begin(), mine.end(), t.data<float>());
  Tensor d = device.is_cpu() ? t : t.to(device);
  pg.broadcast(d, 0)->wait();
  if (!device.is_cpu()) t = d.to(Device::cpu());
  int64_t differ = 0;
  for (size_t i = 0; i < mine.size(); i++) differ += t.data<float>()[i] != mine[i];
  EXPECT_EQ(differ, 0) << "rank " << pg.rank() << " differs from rank 0 in " << differ << " parameters";
}

// The store lives in rank 0's process: rank 0 leaves last, so that a rank still reading the store when a start-up
// error stops it meets that error, not a lost connection.
inline void leave_together(ProcessGroup& pg) {
  TcpStore& store = *pg.store();
  store.add("test/left", 1);
  if (pg.rank() != 0) return;
  while (store.add("test/left", 0) < pg.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

inline int gpus_without_touching_cuda_here() {  // a CUDA context does not survive fork: ask in a throwaway child
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// Skips (returns false) when this build or machine cannot run the case.
inline bool can_run(const DistCase& c, std::string* why) {
  if (!c.gpu() && !gloo_available()) return *why = "no Gloo in this build", false;
  if (c.gpu() && !nccl_available()) return *why = "no NCCL in this build", false;
  if (c.gpu() && gpus_without_touching_cuda_here() < c.world)
    return *why = "needs " + std::to_string(c.world) + " GPUs", false;
  return true;
}

// fn(pg, rank) on each of c.world ranks of the case's backend (Gloo: one OpenMP thread; NCCL: rank r on cuda:r).
inline void on_ranks(const DistCase& c, const std::function<void(ProcessGroup&, int)>& fn) {
  const auto limit = std::chrono::seconds(c.gpu() ? 300 : 60);
  expect_all_pass(run_ranks(c.world, [&](int rank, int port) {
    if (c.gpu()) {
      cuda_set_device(rank);
#ifdef DSCPP_WITH_CUDA
      cuda::set_matmul_allow_tf32(c.precision == "bf16");
#endif
    } else {
      omp_set_num_threads(1);
    }
    auto pg = new_process_group(c.backend, rank, c.world, "127.0.0.1", port, std::chrono::seconds(c.gpu() ? 60 : 30));
    fn(*pg, rank);
    if (c.gpu()) pg->barrier()->wait();
  }, limit));
}

// The case on its ranks against the one-process reference (Note [Equivalence tolerances]).
inline void run_equivalence(const DistCase& c) {
  on_ranks(c, [&](ProcessGroup& pg, int rank) {
    const int device = c.gpu() ? rank : 0;
    auto e = make_engine(c, &pg, device);
    const Trained got = train(*e, c, rank, c.gas);
    expect_sync_counters(*e, c, 3);
    expect_same_on_every_rank(pg, got.params, e->model().params().device());
    const DistCase ref = reference_case(c);
    const Trained want = train(*make_engine(ref, nullptr, device), ref, 0, ref.gas);
    EXPECT_GT(*std::min_element(want.norms.begin(), want.norms.end()), 0.05) << "clipping never engaged";
    expect_equivalent(got, want, c, c.name() + " rank " + std::to_string(rank));
  });
}

}  // namespace dscpp::test
