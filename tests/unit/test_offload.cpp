// ZeRO-Offload of the optimizer (Note [Optimizer offload], src/runtime/offload/optimizer_offload.h) on the CPU device:
// the offload path runs for real (host buffers of their own, the copy stream's copies, the worker thread stepping
// beside the training loop, the forward waiting per unit), and since the host runs the same optimizer kernel on the
// same values as the engine without offload does on the CPU (Note [CPU Adam exactness]), an offloaded run must
// equal a run without offload BIT FOR BIT: parameters, losses and norms after N steps, at stages 1-3 on one and two
// Gloo ranks, under Twin-Flow ratios, with gradient accumulation, fp16 loss scaling with an overflow step, and across
// save -> resume (sharded and universal). The delayed parameter update is checked against what it promises: step
// n + 1 computes on the parameters before step n's update. On a GPU the host and device optimizers differ by float
// rounding (FMA contraction): the Nccl cases compare within Note [Equivalence tolerances] instead.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "checkpoint_fixtures.h"
#include "dist/offload_checks.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/core/copy_stream.h"
#include "runtime/offload/host_affinity.h"
#include "runtime/offload/optimizer_offload.h"
#include "runtime/offload/step_worker.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::dist_case;
using dscpp::test::expect_bits;
using dscpp::test::expect_config_error;
using dscpp::test::floats;
using dscpp::test::parse_config;
using dscpp::test::read_bytes;
using dscpp::test::train_step;
namespace fs = std::filesystem;

namespace {

DistCase plain(DistCase c) {
  c.offload = 0;
  c.delayed_update = false;
  return c;
}

}  // namespace

// ---- configuration ------------------------------------------------------------------------------------------------

TEST(OffloadConfig, DeepSpeedKeysDefaultsAndRules) {
  std::vector<std::string> w;
  const DeepSpeedConfig c =
      parse_config(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})", &w);
  ASSERT_TRUE(c.zero_optimization.offload_optimizer.has_value());
  const OffloadOptimizerConfig& o = *c.zero_optimization.offload_optimizer;
  EXPECT_EQ(o.device, "cpu");
  EXPECT_TRUE(o.pin_memory);  // DeepSpeed >= 0.19.6
  EXPECT_EQ(o.buffer_count, 4);
  EXPECT_FALSE(o.fast_init);
  EXPECT_FALSE(o.pipeline_read);
  EXPECT_EQ(o.ratio, 1.0);
  EXPECT_TRUE(o.enabled());
  EXPECT_TRUE(w.empty()) << w[0];
  EXPECT_FALSE(c.dscpp.offload.delayed_update);
  // Every key, and ours, round-trips (and so reaches the start-up agreement: Note [Start-up agreement]).
  const DeepSpeedConfig all = parse_config(R"("zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu",
      "pin_memory": false, "buffer_count": 2, "fast_init": true, "ratio": 0.25, "pipeline_read": true,
      "pipeline_write": true, "nvme_path": "/tmp/x"}}, "dscpp": {"offload": {"delayed_update": true, "threads": 3}})");
  EXPECT_EQ(DeepSpeedConfig::parse(all.to_json(), 1).canonical_dump(), all.canonical_dump());
  EXPECT_EQ(all.zero_optimization.offload_optimizer->ratio, 0.25);
  EXPECT_TRUE(all.dscpp.offload.delayed_update);
  EXPECT_EQ(all.dscpp.offload.threads, 3);
  expect_config_error(R"("dscpp": {"offload": {"threads": 0}})", "dscpp.offload.threads", {">= 1"});
  bool agreed = false;
  for (const auto& [k, v] : agreement_settings(all, test_fixtures::tiny_model_config()))
    agreed |= k == "dscpp.offload.delayed_update" && v == "true";
  EXPECT_TRUE(agreed);
  EXPECT_FALSE(parse_config(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0}})")
                   .zero_optimization.offload_optimizer->enabled());  // nothing to offload

  expect_config_error(R"("zero_optimization": {"offload_optimizer": {"device": "cpu"}})",
                      "zero_optimization.offload_optimizer.device", {"\"cpu\"", "stage 1, 2 or 3", "got stage 0"});
  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}})",
                      "zero_optimization.offload_optimizer.ratio", {"1.5", "<= 1"});
  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memmory": true}})",
                      "zero_optimization.offload_optimizer.pin_memmory", {"did you mean 'pin_memory'"});
  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "buffer_count": 0}})",
                      "zero_optimization.offload_optimizer.buffer_count", {"0", ">= 1", "slots"});
  expect_config_error(R"("zero_optimization": {"stage": 2}, "dscpp": {"offload": {"delayed_update": true}})",
                      "dscpp.offload.delayed_update", {"offload_optimizer.device \"cpu\""});
  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0}},
                      "dscpp": {"offload": {"delayed_update": true}})",
                      "dscpp.offload.delayed_update", {"offload_optimizer.device \"cpu\""});
}

// ---- the pieces ---------------------------------------------------------------------------------------------------

TEST(Offload, CopyStreamOnTheCpuCopiesAtOnce) {
  CopyStream s(Device::cpu());
  Tensor a = Tensor::empty({5}, DType::f32), b = Tensor::zeros({5}, DType::f32);
  for (int i = 0; i < 5; i++) a.data<float>()[i] = float(i) + 0.5f;
  s.wait_for_current_stream();
  s.copy(b, a);
  CopyEvent e;
  s.record(e);
  e.synchronize();
  e.make_current_stream_wait();
  EXPECT_EQ(b.data<float>()[4], 4.5f);
  EXPECT_THROW(s.copy(b, Tensor::empty({5}, DType::bf16)), Error);  // same dtype only
}

TEST(Offload, StepWorkerReportsProgressAndErrors) {
  StepWorker w;
  w.set_progress(7);
  EXPECT_TRUE(w.reached(7));
  std::atomic<bool> go{false};
  w.run([&] {
    while (!go) std::this_thread::yield();
    w.advance(1);
    w.advance(2);
  });
  EXPECT_FALSE(w.reached(1));
  go = true;
  w.wait_for(2);
  w.wait();
  EXPECT_TRUE(w.idle());
  w.run([&] {
    w.advance(1);
    DSCPP_FAIL("host step failed on purpose");
  });
  w.wait_for(1);
  EXPECT_THROW(w.wait_for(2), Error);  // the job ended before reaching it: its error, not a hang
  w.run([] {});
  w.wait();
}

// Pieces cut smaller than a unit and fewer copy slots than pieces: each piece's gradients wait for the slot the
// piece before read, each 16-bit slot for its last copy to the device; the result is the plain optimizer's.
TEST(Offload, PiecesAndSlotsDoNotChangeTheUpdate) {
  const ModelConfig mc = test_fixtures::tiny_model_config("llama");
  OptimizerConfig oc;
  oc.type = "adamw";
  oc.adam.weight_decay = 0.1;
  for (const auto& [piece, slots] : {std::pair<int64_t, int64_t>{64, 1}, {1000, 3}, {1 << 24, 4}}) {
    SCOPED_TRACE("piece " + std::to_string(piece) + ", slots " + std::to_string(slots));
    auto a = make_model(mc), b = make_model(mc);
    a->init_weights(5);
    b->init_weights(5);
    ParamSet& pa = a->params();
    ParamSet& pb = b->params();
    auto plain_opt = make_optimizer(oc, pb);
    const ZeroPartition zp(1, 1, 0, pa.units());
    OffloadOptimizerConfig cfg;
    cfg.device = "cpu";
    cfg.buffer_count = slots;
    cfg.pin_memory = slots != 3;  // pageable host buffers too
    auto unit_of = [&](const Tensor& flat) {
      return [&pa, flat](size_t u) { return flat.slice(pa.units()[u].begin, pa.units()[u].size()); };
    };
    DscppOffloadConfig ours;
    ours.threads = 2;
    OptimizerOffload o(oc, cfg, ours, {}, pa, zp, false, false, false, unit_of(pa.flat_params()),
                       unit_of(pa.flat_grads()),
                       piece);
    o.refresh_masters();
    for (int step = 0; step < 3; step++) {
      o.before_backward(true);  // the device gradients are free again
      Rng rng(77 + uint64_t(step));
      for (int64_t i = 0; i < pa.flat_numel(); i++) {
        const float g = float(rng.uniform()) - 0.5f;
        pa.flat_grads().data<float>()[i] = g;
        pb.flat_grads().data<float>()[i] = g;
      }
      o.end_grads();
      o.step(0.01f, 0.5f);
      plain_opt->step(0.01f, 0.5f);
    }
    o.finish();
    expect_bits(floats(pa.flat_params()), floats(pb.flat_params()), "parameters");
    expect_bits(floats(o.state_tensors()[1].second), floats(plain_opt->state_tensors()[1].second), "exp_avg_sq");
    int64_t largest = 0;
    for (const FlatRange& u : pa.units()) largest = std::max(largest, std::min(piece, u.size()));
    EXPECT_EQ(o.bytes().host_grads, largest * 4 * slots) << "slots of the largest piece";
  }
}

// ---- offloaded equals not offloaded, bit for bit ------------------------------------------------------------------

namespace {

std::vector<DistCase> exact_cases() {
  std::vector<DistCase> v;
  auto add = [&](int world, int stage, const char* arch, const std::function<void(DistCase&)>& more) {
    v.push_back(dist_case(world, stage, arch, [&](DistCase& c) {
      c.optimizer = "adamw";
      c.offload = 1.0;
      if (more) more(c);
    }));
  };
  for (int world : {1, 2})
    for (int stage : {1, 2, 3}) add(world, stage, stage == 2 ? "llama" : "gpt2", nullptr);
  // Twin-Flow: a share of each rank's shard steps on the device.
  add(2, 2, "gpt2", [](DistCase& c) { c.offload = 0.5; });
  add(2, 3, "llama", [](DistCase& c) { c.offload = 0.5; });
  add(1, 3, "llama", [](DistCase& c) { c.offload = 0.3; });
  // The fp16 engine path (f32 masters beside the parameters, the loss scaler), SGD, no gradient accumulation,
  // reductions at the end of backward, a longer model.
  add(2, 2, "llama", [](DistCase& c) { c.precision = "fp16"; });
  add(1, 1, "gpt2", [](DistCase& c) { c.precision = "fp16", c.offload = 0.5; });
  add(2, 1, "llama", [](DistCase& c) { c.optimizer = "sgd"; });
  // Lion and Adagrad step on the host with the device's kernels too (ratio 0.5: both halves).
  add(2, 2, "gpt2", [](DistCase& c) { c.optimizer = "lion", c.offload = 0.5; });
  add(1, 3, "llama", [](DistCase& c) { c.optimizer = "adagrad"; });
  add(2, 3, "gpt2", [](DistCase& c) { c.gas = 1, c.overlap = false, c.n_layer = 5; });
  // One and two copy slots: every piece's gradients wait for the slot the piece before read.
  add(1, 2, "llama", [](DistCase& c) { c.offload_buffers = 1; });
  add(2, 3, "gpt2", [](DistCase& c) { c.offload_buffers = 2, c.precision = "fp16", c.offload = 0.7; });
  return v;
}

}  // namespace

class OffloadExact : public ::testing::TestWithParam<DistCase> {};

TEST_P(OffloadExact, EqualsTheSameRunWithoutOffload) {
  const DistCase c = GetParam();
  std::string why;
  if (!dscpp::test::can_run(c, &why)) GTEST_SKIP() << why;
  dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
    auto e = dscpp::test::make_engine(c, &pg);
    ASSERT_NE(e->offload(), nullptr);
    const ModelStateBytes bytes = e->model_state_bytes(), theory = e->theoretical_model_state_bytes();
    EXPECT_GT(bytes.host, 0);
    EXPECT_NEAR(double(bytes.host), double(theory.host), 0.1 * double(theory.host)) << e->model_state_report();
    EXPECT_NEAR(double(bytes.optimizer), double(theory.optimizer), 0.1 * double(theory.optimizer) + 1024)
        << e->model_state_report();
    EXPECT_NE(e->model_state_report().find("offload_optimizer"), std::string::npos) << e->model_state_report();
    const DistCase p = plain(c);
    auto r = dscpp::test::make_engine(p, &pg);
    ASSERT_EQ(r->offload(), nullptr);
    EXPECT_LT(bytes.optimizer, r->model_state_bytes().optimizer) << "the states left the device";
    dscpp::test::expect_same_training(*e, c, *r, p, rank);
    const std::string what = c.name() + " rank " + std::to_string(rank);
    EXPECT_EQ(e->optimizer().step_count(), r->optimizer().step_count());
    EXPECT_EQ(e->optimizer().name(), r->optimizer().name());
    if (c.precision == "fp16") expect_bits(floats(e->master_params()), floats(r->master_params()), what + ": masters");
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, OffloadExact, ::testing::ValuesIn(exact_cases()),
                         [](const auto& i) { return i.param.name(); });

// fp16 loss scaling: an inf in the gradients skips the step on the host as on the device (no host step, no LR step,
// the scale halves), and the runs stay equal through it.
TEST(Offload, OverflowSkipsTheHostStepToo) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";  // the ranks of these cases talk through Gloo
  for (const DistCase& base : {dist_case(2, 2, "llama"), dist_case(1, 3, "gpt2")}) {
    DistCase c = base;
    c.optimizer = "adamw";
    c.precision = "fp16";
    c.offload = 1.0;
    SCOPED_TRACE(c.name());
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto e = dscpp::test::make_engine(c, &pg), r = dscpp::test::make_engine(plain(c), &pg);
      for (Engine* x : {e.get(), r.get()})
        for (int64_t s = 0; s < 4; s++) train_step(*x, c, rank, s, /*poison=*/s == 1);
      EXPECT_EQ(e->skipped_steps(), 1);
      EXPECT_EQ(r->skipped_steps(), 1);
      EXPECT_EQ(e->optimizer().step_count(), 3);
      EXPECT_EQ(e->loss_scale(), r->loss_scale());
      EXPECT_LT(e->loss_scale(), 256.0) << "the overflow lowered the scale";
      expect_bits(floats(e->master_params()), floats(r->master_params()), "masters");
      expect_bits(dscpp::test::named_params(*e), dscpp::test::named_params(*r), "parameters");
    });
  }
}

// Note [Optimizer offload]'s delayed parameter update: step n + 1 computes on the parameters from before step n's
// update, which lands at step n + 1's boundary; model() applies a pending update at once. (The cases' linear WarmupLR
// over 2 steps gives lr 0 to the first two steps: p2 = p1 = p0, so the checks start after them.)
TEST(Offload, DelayedUpdateComputesOnTheParametersOfTheStepBefore) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";  // the ranks of these cases talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("dscpp_offload_dpu_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const DistCase& base : {dist_case(1, 2, "gpt2", [](DistCase& c) { c.gas = 1; }),
                               dist_case(2, 3, "llama", [](DistCase& c) { c.gas = 1; }),
                               dist_case(2, 1, "gpt2"),
                               dist_case(1, 3, "llama", [](DistCase& c) { c.gas = 1, c.offload = 0.5; })}) {
    DistCase c = base;
    c.optimizer = "adamw";
    // Twin-Flow's device share is not delayed: the staleness checks hold with everything offloaded.
    const bool all = base.offload == 0;
    c.offload = all ? 1.0 : base.offload;
    c.delayed_update = true;
    SCOPED_TRACE(c.name());
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto losses = [&](const DistCase& x, const std::vector<int64_t>& data) {
        auto e = dscpp::test::make_engine(x, &pg);
        std::vector<float> out;
        for (int64_t d : data) {
          train_step(*e, x, rank, d);
          out.push_back(e->global_last_loss());
        }
        return out;
      };
      // Without offload, data 9, 8, 0, 1 on p0, p1 = p0, p2 = p0, p3.
      const std::vector<float> r = losses(plain(c), {9, 8, 0, 1});
      // Delayed, data 9, 8, 0, 0, 1: the fourth step still computes on p2, the fifth on p3.
      const std::vector<float> l = losses(c, {9, 8, 0, 0, 1});
      for (int i : {0, 1, 2}) EXPECT_EQ(l[size_t(i)], r[size_t(i)]) << "step " << i;
      if (all) {
        EXPECT_EQ(l[3], r[2]) << "the fourth step computed on the third step's update";
        EXPECT_EQ(l[4], r[3]) << "the fifth step did not compute on the third step's update";
      } else {
        EXPECT_NE(l[3], r[2]) << "the device share's update is not delayed";
      }
      // Three delayed steps, then model(): the pending update is applied, equal to three plain steps.
      auto one = dscpp::test::make_engine(c, &pg), ref = dscpp::test::make_engine(plain(c), &pg);
      for (int64_t d : {9, 8, 0}) train_step(*one, c, rank, d), train_step(*ref, c, rank, d);
      const std::vector<float> a = dscpp::test::named_params(*one), b = dscpp::test::named_params(*ref);
      expect_bits(a, b, "after three steps and model()");
      EXPECT_NE(a, dscpp::test::named_params(*dscpp::test::make_engine(plain(c), &pg))) << "nothing trained";
      // A save applies the pending update; resuming from it continues exactly as the run that saved.
      const fs::path tag_dir = dir / c.name();
      one->save_checkpoint(tag_dir.string());
      const auto want = dscpp::test::train(*one, c, rank, c.gas, 2, 3).params;
      auto resumed = dscpp::test::make_engine(c, &pg);
      resumed->load_checkpoint(tag_dir.string());
      expect_bits(dscpp::test::train(*resumed, c, rank, c.gas, 2, 3).params, want, "delayed, resumed");
    });
  }
  fs::remove_all(dir);
}

// Checkpoints hold the same tensors under the same names as without offload: the files are byte-identical, a resume
// continues bit for bit, either way between offloaded and not, and a universal tag loads into another world size.
TEST(Offload, CheckpointsAreTheSameAsWithoutOffload) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";  // the ranks of these cases talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("dscpp_offload_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const DistCase& base : {dist_case(2, 3, "llama"), dist_case(2, 2, "gpt2"), dist_case(1, 2, "llama")}) {
    DistCase c = base;
    c.optimizer = "adamw";
    c.precision = "fp16";
    c.offload = base.world == 2 && base.stage == 3 ? 0.5 : 1.0;
    SCOPED_TRACE(c.name());
    const fs::path off_dir = dir / (c.name() + "_off"), plain_dir = dir / (c.name() + "_plain");
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto e = dscpp::test::make_engine(c, &pg), r = dscpp::test::make_engine(plain(c), &pg);
      for (int64_t s = 0; s < 2; s++) train_step(*e, c, rank, s), train_step(*r, c, rank, s);
      e->save_checkpoint(off_dir.string());
      r->save_checkpoint(plain_dir.string());
      const auto want = dscpp::test::train(*e, c, rank, c.gas, 2, 2).params;
      const std::string shard = c.world > 1 ? "zero/rank_" + std::to_string(rank) + ".safetensors"
                                            : "optim_states.safetensors";
      const std::string a = read_bytes(off_dir / "global_step2" / shard), b = read_bytes(plain_dir / "global_step2" / shard);
      EXPECT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << shard << " differs with offload";
      // Resume: offloaded from offloaded, plain from offloaded, offloaded from plain.
      for (const auto& [from, offloaded] : {std::pair{off_dir, true}, {off_dir, false}, {plain_dir, true}}) {
        auto x = dscpp::test::make_engine(offloaded ? c : plain(c), &pg);
        x->load_checkpoint(from.string());
        EXPECT_EQ(x->global_steps(), 2);
        expect_bits(dscpp::test::train(*x, c, rank, c.gas, 2, 2).params, want,
                    std::string("resumed ") + (offloaded ? "offloaded" : "plain") + " from " + from.filename().string());
      }
    });
    if (c.world == 1) continue;
    // Universal: the offloaded world-2 tag into one process, offloaded (Twin-Flow) and not: the same run.
    convert_to_universal(off_dir.string(), "", "", "");
    DistCase one = c;
    one.world = 1;
    one.gas = c.gas * 2;  // the same global batch
    one.offload = 0.5;
    dscpp::test::on_ranks(one, [&](ProcessGroup& pg, int) {
      std::vector<std::vector<float>> got;
      for (const DistCase& x : {one, plain(one)}) {
        auto e = dscpp::test::make_engine(x, &pg);
        e->load_checkpoint(off_dir.string(), "global_step2_universal");
        got.push_back(dscpp::test::train(*e, x, 0, x.gas, 2, 2).params);
      }
      expect_bits(got[0], got[1], "universal resume, offloaded against not");
    });
  }
  fs::remove_all(dir);
}

// On GPUs (skipped without them): the copy stream, pinned buffers, events and the worker for real; the host and the
// device optimizers differ by float rounding, so each case is compared with the one-process reference within Note
// [Equivalence tolerances] (SGD, whose update is linear in the gradient).
namespace {
std::vector<DistCase> nccl_cases() {
  std::vector<DistCase> v;
  for (int stage : {1, 2, 3})
    v.push_back(dist_case(2, stage, stage == 2 ? "gpt2" : "llama", [](DistCase& c) {
      c.backend = "nccl";
      c.offload = 1.0;
    }));
  v.push_back(dist_case(2, 3, "llama", [](DistCase& c) { c.backend = "nccl", c.offload = 0.5, c.precision = "bf16"; }));
  v.push_back(dist_case(1, 2, "gpt2", [](DistCase& c) { c.backend = "nccl", c.offload = 1.0, c.precision = "bf16"; }));
  return v;
}
}  // namespace

class OffloadNccl : public ::testing::TestWithParam<DistCase> {};

TEST_P(OffloadNccl, MatchesOneProcessWithoutOffload) {
  std::string why;
  if (!dscpp::test::can_run(GetParam(), &why)) GTEST_SKIP() << why;
  dscpp::test::run_equivalence(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Nccl, OffloadNccl, ::testing::ValuesIn(nccl_cases()),
                         [](const auto& i) { return i.param.name(); });

// Note [Host step affinity]: sysfs's CPU lists, a device's node from a fake sysfs tree, and the OpenMP team pinned
// one thread per CPU (on this machine's allowed CPUs, the node every CI host has).
TEST(HostAffinity, CpuListsNodesAndPinning) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpu_list(" 2-3, 1 ,3"), (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_THROW(parse_cpu_list("3-1"), Error);
  EXPECT_THROW(parse_cpu_list("a-b"), Error);

  const std::filesystem::path sysfs = std::filesystem::temp_directory_path() / ("dscpp_sysfs_" + std::to_string(getpid()));
  std::filesystem::create_directories(sysfs / "devices/system/node/node1");
  std::ofstream(sysfs / "devices/system/node/node1/cpulist") << "16-19,48-49\n";
  EXPECT_EQ(numa_node_cpus(1, sysfs.string()), (std::vector<int>{16, 17, 18, 19, 48, 49}));
  EXPECT_TRUE(numa_node_cpus(0, sysfs.string()).empty());   // no such node: unknown
  EXPECT_TRUE(numa_node_cpus(-1, sysfs.string()).empty());  // a one-node host's -1
  EXPECT_EQ(device_numa_node(Device::cpu(), sysfs.string()), -1);
  // No node for the CPU device: every allowed CPU serves, unpinned, with or without numa_affinity.
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  for (bool numa : {true, false}) {
    const HostStepCpus h = host_step_cpus(Device::cpu(), numa, sysfs.string());
    EXPECT_EQ(h.node, -1);
    EXPECT_EQ(h.cpus, allowed);
  }
  std::filesystem::remove_all(sysfs);

  // The team lands where it was put, and a bound scope gives the caller its mask back.
  const int threads = int(std::min<size_t>(allowed.size(), 3));
  std::thread t([&] {
    const std::vector<int> on = pin_openmp_team(allowed, threads);
    for (int i = 0; i < threads; i++) EXPECT_EQ(on[size_t(i)], allowed[size_t(i) % allowed.size()]) << "thread " << i;
  });
  t.join();
  {
    const ScopedCpuBinding one({allowed.back()});
    EXPECT_EQ(allowed_cpus(), (std::vector<int>{allowed.back()}));
  }
  EXPECT_EQ(allowed_cpus(), allowed);

  // The config key: on by default, refused when not a bool, kept in the canonical JSON.
  EXPECT_TRUE(DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1})").dscpp.offload.numa_affinity);
  const DeepSpeedConfig off = DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": 1, "dscpp": {"offload": {"numa_affinity": false}}})");
  EXPECT_FALSE(off.dscpp.offload.numa_affinity);
  EXPECT_FALSE(DeepSpeedConfig::parse(off.to_json(), 1).dscpp.offload.numa_affinity);
  try {
    DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1, "dscpp": {"offload": {"numa_affinity": 2}}})");
    ADD_FAILURE() << "numa_affinity 2 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, "dscpp.offload.numa_affinity") << e.what();
  }
}
