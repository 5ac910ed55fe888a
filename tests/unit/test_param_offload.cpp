// ZeRO-3 parameter offload (Note [Parameter offload], src/runtime/offload/param_offload.h) on the CPU device: the
// partition lives in a host buffer of its own and every gather uploads from it through the copy stream (and, with
// pin_memory false, through staging buffers), so the offload path runs for real; since nothing changes the values on
// the way, an offloaded run must equal the same run without offload BIT FOR BIT, with and without offload_optimizer
// (ZeRO-Infinity's CPU case, where the host step writes the partition itself), on one and two Gloo ranks, and across
// save -> resume; with the partition on NVMe (offload_param.device "nvme": a mapped swap file in a temporary folder)
// likewise, with the device optimizer and with the host step writing it. On GPUs (the Nccl cases, skipped without them) the same runs are compared within Note
// [Equivalence tolerances].
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "dist/offload_checks.h"
#include "runtime/offload/param_offload.h"
#include "scratch_dirs.h"
#include "swap_fixtures.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::dist_case;
using dscpp::test::expect_bits;
using dscpp::test::expect_config_error;
using dscpp::test::parse_config;
using dscpp::test::read_bytes;
using dscpp::test::train_step;
namespace fs = std::filesystem;

namespace {

// The same case with the parameters on the device and the optimizer not offloaded.
DistCase plain(DistCase c) {
  c.offload_param = false;
  c.offload = 0;
  c.sharded_init = false;
  return c;
}

DistCase offloaded(int world, const char* arch, const std::function<void(DistCase&)>& more = nullptr) {
  return dist_case(world, 3, arch, [&](DistCase& c) {
    c.optimizer = "adamw";
    c.offload_param = true;
    if (more) more(c);
  });
}

fs::path swap_root() {
  static const fs::path p = [] {
    fs::path d = fs::temp_directory_path() / ("dscpp_param_nvme_" + std::to_string(::getpid()));
    dscpp::test_fixtures::remove_when_tests_end(d.string());
    return d;
  }();
  return p;
}

// The parameters on "NVMe": a folder of their own under the temporary directory (a shared mapping needs no O_DIRECT).
void on_nvme(DistCase& c) {
  c.param_nvme_path = "set";  // the name says so
  c.param_nvme_path = (swap_root() / c.name()).string();
}

// DeepSpeed's folder for this rank's parameter swap file.
fs::path param_swap_folder(const DistCase& c, int rank) {
  return fs::path(c.param_nvme_path) / "zero_stage_3" / (c.precision == "bf16" ? "bfloat16params" : "float32params") /
         ("rank" + std::to_string(rank));
}

}  // namespace

TEST(ParamOffloadConfig, DeepSpeedKeysDefaultsAndRules) {
  std::vector<std::string> w;
  const DeepSpeedConfig c =
      parse_config(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}})", &w);
  ASSERT_TRUE(c.zero_optimization.offload_param.has_value());
  const OffloadParamConfig& o = *c.zero_optimization.offload_param;
  EXPECT_TRUE(o.enabled());
  EXPECT_EQ(o.buffer_count, 5);
  EXPECT_EQ(o.buffer_size, 100000000);
  EXPECT_EQ(o.max_in_cpu, 1000000000);
  EXPECT_TRUE(o.pin_memory);  // DeepSpeed >= 0.19.6, as offload_optimizer
  EXPECT_TRUE(w.empty()) << w[0];
  const DeepSpeedConfig all = parse_config(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
      "pin_memory": true, "buffer_count": 2, "buffer_size": 1000, "max_in_cpu": 5}})");
  EXPECT_EQ(DeepSpeedConfig::parse(all.to_json(), 1).canonical_dump(), all.canonical_dump());
  EXPECT_FALSE(parse_config(R"("zero_optimization": {"stage": 2, "offload_param": {"device": "none"}})")
                   .zero_optimization.offload_param->enabled());

  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})",
                      "zero_optimization.offload_param.device", {"\"cpu\"", "stage 3", "got stage 2"});
  expect_config_error(R"("zero_optimization": {"offload_param": {"device": "cpu"}})",
                      "zero_optimization.offload_param.device", {"stage 3", "got stage 0"});
  const DeepSpeedConfig nvme = parse_config(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
      "nvme_path": "/local_nvme"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}})");
  EXPECT_EQ(nvme.zero_optimization.offload_param->nvme_path.value_or(""), "/local_nvme");
  expect_config_error(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}})",
                      "zero_optimization.offload_param.nvme_path", {"required", "\"nvme\""});
  expect_config_error(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x",
                      "buffer_count": 0}})", "zero_optimization.offload_param.buffer_count", {"0", ">= 1", "\"nvme\""});
  for (const char* k : {"buffer_count", "buffer_size"})
    expect_config_error(std::string(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", ")") + k +
                            R"(": 0}})",
                        std::string("zero_optimization.offload_param.") + k, {"0", ">= 1", "staging"});
  expect_config_error(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                      "offload_optimizer": {"device": "cpu", "ratio": 0.5}})",
                      "zero_optimization.offload_optimizer.ratio", {"0.5", "Twin-Flow", "offload_param"});
  expect_config_error(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                      "offload_optimizer": {"device": "cpu"}}, "dscpp": {"offload": {"delayed_update": true}})",
                      "dscpp.offload.delayed_update", {"offload_param"});
}

// ---- offloaded equals not offloaded, bit for bit ------------------------------------------------------------------

namespace {

std::vector<DistCase> exact_cases() {
  using F = std::function<void(DistCase&)>;
  std::vector<DistCase> v;
  for (int world : {1, 2}) {
    // The device optimizer into the host partition; pinned, and pageable through two staging buffers of 100
    // elements (every unit's copy in pieces that reuse them).
    v.push_back(offloaded(world, "gpt2"));
    v.push_back(offloaded(world, "llama", F([](DistCase& c) { c.pin_param = false, c.param_buffer_size = 100; })));
    // ZeRO-Infinity's CPU case: the host step writes the partition.
    v.push_back(offloaded(world, "llama", F([](DistCase& c) { c.offload = 1.0; })));
    v.push_back(offloaded(world, "gpt2", F([](DistCase& c) { c.offload = 1.0, c.pin_param = false; })));
  }
  // The fp16 engine path (device masters), SGD, sharded initialisation, every unit released after each use, one
  // micro-batch per step, copy engines (over Gloo), no prefetch.
  v.push_back(offloaded(1, "gpt2", F([](DistCase& c) { c.precision = "fp16", c.param_buffer_size = 64; })));
  v.push_back(offloaded(2, "llama", F([](DistCase& c) { c.precision = "fp16", c.offload = 1.0; })));
  v.push_back(offloaded(2, "gpt2", F([](DistCase& c) { c.optimizer = "sgd", c.sharded_init = true; })));
  v.push_back(offloaded(1, "llama", F([](DistCase& c) { c.sharded_init = true, c.offload = 1.0; })));
  v.push_back(offloaded(2, "llama", F([](DistCase& c) { c.reuse = 0, c.persistence = 0, c.gas = 1; })));
  v.push_back(offloaded(2, "gpt2", F([](DistCase& c) { c.copy_engine = true, c.pin_param = false; })));
  v.push_back(offloaded(1, "gpt2", F([](DistCase& c) {
    c.prefetch = 0, c.persistence = 0, c.checkpointing = false, c.n_layer = 3;
  })));
  // On NVMe: the device optimizer through staging buffers of 100 elements, the host step (CPU and NVMe optimizer
  // states) writing the mapped partition, every unit uploaded at each use.
  for (int world : {1, 2}) {
    v.push_back(offloaded(world, "llama", F([](DistCase& c) { c.param_buffer_size = 100, on_nvme(c); })));
    v.push_back(offloaded(world, "gpt2", F([](DistCase& c) { c.offload = 1.0, on_nvme(c); })));
  }
  v.push_back(offloaded(2, "llama", F([](DistCase& c) { c.reuse = 0, c.persistence = 0, c.gas = 1, on_nvme(c); })));
  v.push_back(offloaded(2, "llama", F([](DistCase& c) {
    c.offload = 1.0, c.sub_group = 1000, c.offload_buffers = 3, c.nvme_path = (swap_root() / "optimizer").string();
    on_nvme(c);
  })));
  return v;
}

}  // namespace

class ParamOffloadExact : public ::testing::TestWithParam<DistCase> {};

TEST_P(ParamOffloadExact, EqualsTheSameRunWithoutOffload) {
  const DistCase c = GetParam();
  std::string why;
  if (!dscpp::test::can_run(c, &why)) GTEST_SKIP() << why;
  if (!c.nvme_path.empty())
    if (const std::string no = dscpp::test::swap_unavailable(c.nvme_path); !no.empty()) GTEST_SKIP() << no;
  const bool nvme = !c.param_nvme_path.empty();
  dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
    auto e = dscpp::test::make_engine(c, &pg);
    ASSERT_NE(e->param_offload(), nullptr);
    ASSERT_NE(e->zero_params(), nullptr) << "gathered through the coordinator in one process too";
    EXPECT_FALSE(e->model().params().flat_params().defined()) << "no whole model on the device";
    // What it placed: the partition in host memory or its swap file, only the staging (if any) on the device.
    const ParamOffloadBytes pb = e->param_offload()->bytes();
    const ModelStateBytes bytes = e->model_state_bytes(), theory = e->theoretical_model_state_bytes();
    const int64_t partition = e->zero_partition().shard_numel() * 4;
    EXPECT_EQ(pb.host_partition, nvme ? 0 : partition);
    EXPECT_EQ(pb.nvme, nvme ? aio_aligned(partition) : 0);
    EXPECT_EQ(bytes.params, pb.device_staging);
    EXPECT_EQ(pb.device_staging > 0, c.offload == 0) << "the device optimizer's buffers only without offload_optimizer";
    EXPECT_EQ(pb.host_staging > 0, !c.pin_param || nvme) << "staging only for a pageable or mapped partition";
    EXPECT_EQ(bytes.host_params, pb.host_partition + pb.host_staging);
    EXPECT_EQ(theory.params, 0);
    EXPECT_NEAR(double(nvme ? theory.nvme : theory.host_params), double(partition), 0.1 * double(partition));
    if (nvme) {
      EXPECT_EQ(theory.host_params, 0);
    }
    const std::string report = e->model_state_report();
    EXPECT_NE(report.find(nvme ? "offload_param on NVMe" : "offload_param in"), std::string::npos) << report;
    EXPECT_NE(report.find("placed on cpu"), std::string::npos) << report;
    const fs::path file = param_swap_folder(c, rank) / "partition.tensor.swp";
    if (nvme) {  // DeepSpeed's folder, the partition's bytes reserved
      EXPECT_EQ(e->param_offload()->nvme_folder(), param_swap_folder(c, rank).string());
      ASSERT_TRUE(fs::exists(file)) << file;
      EXPECT_EQ(int64_t(fs::file_size(file)), pb.nvme);
    }

    const DistCase p = plain(c);
    auto r = dscpp::test::make_engine(p, &pg);
    ASSERT_EQ(r->param_offload(), nullptr);
    dscpp::test::expect_same_training(*e, c, *r, p, rank);
    EXPECT_GT(e->zero_params()->gathers(), 0);
    if (nvme) {  // what training wrote went through the file: its bytes are the partition's
      e->model();
      const Tensor part = e->param_offload()->partition();
      std::string bytes_on_disk = read_bytes(file);
      ASSERT_GE(int64_t(bytes_on_disk.size()), partition);
      EXPECT_EQ(std::memcmp(bytes_on_disk.data(), part.raw(), size_t(partition)), 0);
      e.reset();
      EXPECT_FALSE(fs::exists(param_swap_folder(c, rank))) << "a clean exit removes the swap folder";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, ParamOffloadExact, ::testing::ValuesIn(exact_cases()),
                         [](const auto& i) { return i.param.name(); });

// The device holds no lasting copy: what the host partition holds is what the next forward computes with. A poisoned
// partition (NaN in one unit) reaches the loss at once (fp16: the step is skipped as an overflow); with the values
// put back the run goes on. No unit stays gathered between uses (persistence and reuse 0), so every use uploads.
TEST(ParamOffload, TheForwardReadsTheHostPartition) {
  auto each_use = [](DistCase& x) { x.precision = "fp16", x.persistence = 0, x.reuse = 0; };
  for (const DistCase& c : {offloaded(1, "llama", each_use), offloaded(2, "gpt2", [&](DistCase& x) {
                              each_use(x);
                              x.offload = 1.0;
                            })}) {
    std::string why;
    if (!dscpp::test::can_run(c, &why)) GTEST_SKIP() << why;
    SCOPED_TRACE(c.name());
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto e = dscpp::test::make_engine(c, &pg);
      train_step(*e, c, rank, 0);
      train_step(*e, c, rank, 1);
      e->model();  // the update has landed in the partition
      Tensor part = e->param_offload()->partition();
      const Tensor saved = part.clone();
      const ZeroPartition& zp = e->zero_partition();
      const size_t unit = zp.units().size() - 1;  // the final norm (+ head): used by every forward
      part.slice(zp.shard_offset(unit), zp.chunk(unit)).fill(std::nanf(""));
      train_step(*e, c, rank, 1);
      EXPECT_TRUE(std::isnan(e->global_last_loss())) << "the forward did not read the host partition";
      EXPECT_EQ(e->skipped_steps(), 1);
      e->model();
      part.copy_from(saved);
      train_step(*e, c, rank, 1);
      auto r = dscpp::test::make_engine(plain(c), &pg);  // data 0, 1, 1 without the poison
      for (int64_t d : {0, 1, 1}) train_step(*r, plain(c), rank, d);
      EXPECT_EQ(e->global_last_loss(), r->global_last_loss()) << "the same data on the same parameters";
    });
  }
}

// Checkpoints hold the same bytes as without parameter offload, and a resume continues bit for bit, between offloaded
// and not either way.
TEST(ParamOffload, CheckpointsAndResumeAreTheSameAsWithoutOffload) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  const fs::path dir = fs::temp_directory_path() / ("dscpp_param_offload_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const DistCase& c : {offloaded(2, "llama", [](DistCase& x) { x.offload = 1.0; }),
                            offloaded(1, "gpt2", [](DistCase& x) { x.precision = "fp16", x.pin_param = false; }),
                            offloaded(1, "llama", [](DistCase& x) { x.offload = 1.0; }),
                            offloaded(2, "gpt2", [](DistCase& x) { x.offload = 1.0, on_nvme(x); })}) {
    SCOPED_TRACE(c.name());
    const fs::path off_dir = dir / (c.name() + "_off"), plain_dir = dir / (c.name() + "_plain");
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto e = dscpp::test::make_engine(c, &pg), r = dscpp::test::make_engine(plain(c), &pg);
      for (int64_t s = 0; s < 2; s++) train_step(*e, c, rank, s), train_step(*r, plain(c), rank, s);
      e->save_checkpoint(off_dir.string());
      r->save_checkpoint(plain_dir.string());
      const auto want = dscpp::test::train(*r, plain(c), rank, c.gas, 2, 2).params;
      for (const char* f : {"model_states.safetensors", "optim_states.safetensors", "zero/rank_0.safetensors",
                            "zero/rank_1.safetensors"}) {
        const fs::path a = off_dir / "global_step2" / f, b = plain_dir / "global_step2" / f;
        EXPECT_EQ(fs::exists(a), fs::exists(b)) << f;
        if (fs::exists(b)) {
          EXPECT_TRUE(read_bytes(a) == read_bytes(b)) << f << " differs with parameter offload";
        }
      }
      for (const auto& [from, offload] : {std::pair{off_dir, true}, {off_dir, false}, {plain_dir, true}}) {
        const DistCase x = offload ? c : plain(c);
        auto y = dscpp::test::make_engine(x, &pg);
        y->load_checkpoint(from.string());
        EXPECT_EQ(y->global_steps(), 2);
        expect_bits(dscpp::test::train(*y, x, rank, x.gas, 2, 2).params, want,
                    std::string("resumed ") + (offload ? "offloaded" : "plain") + " from " + from.filename().string());
      }
    });
  }
  fs::remove_all(dir);
}

// A disk too small for the parameters' swap file (RLIMIT_FSIZE in a child: reserving past it fails with EFBIG, as a
// full disk fails with ENOSPC) stops the engine at start-up, naming the key, the rank and the bytes, and leaves no
// swap folder behind.
TEST(ParamOffload, ADiskTooSmallFailsAtStartNamingTheBytes) {
  const DistCase c = offloaded(1, "llama", on_nvme);
  const int status = dscpp::test::child_exit_code([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    omp_set_num_threads(1);  // the parent's OpenMP pool does not exist in this process
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    const rlimit small{rlim_t(4096), lim.rlim_max};  // the partition is tens of KiB
    ::setrlimit(RLIMIT_FSIZE, &small);
    const std::string e = dscpp::test::error_of([&] { dscpp::test::make_engine(c, nullptr); });
    for (const char* part : {"zero_optimization.offload_param.nvme_path", "rank 0", "reserving", "bytes"})
      if (e.find(part) == std::string::npos) return std::fprintf(stderr, "child: %s lacks %s\n", e.c_str(), part), 1;
    return fs::exists(param_swap_folder(c, 0)) ? 2 : 0;
  });
  EXPECT_EQ(status, 0);
}

// Note [Memory tiers]: the estimate of what the engine places on each tier at start-up is what it placed, byte for
// byte, for every offload choice (NVMe where the temporary folder takes O_DIRECT); and the coordinator's gathers in
// one process follow the estimator's replay.
TEST(ParamOffload, EstimateMatchesWhatTheEnginePlaced) {
  using F = std::function<void(DistCase&)>;
  const std::string swap = (fs::temp_directory_path() / ("dscpp_tiers_" + std::to_string(::getpid()))).string();
  const std::string no_swap = dscpp::test::swap_unavailable(swap);
  auto nvme = [&](int world, int stage, int64_t sub_group, int64_t buffers) {
    return dist_case(world, stage, "llama", [&](DistCase& x) {
      x.optimizer = "adamw", x.offload = 1.0, x.nvme_path = swap, x.sub_group = sub_group;
      x.offload_buffers = buffers, x.pipeline_read = buffers > 6;
    });
  };
  for (const DistCase& c :
       {offloaded(1, "gpt2"),
        offloaded(2, "llama", F([](DistCase& x) { x.pin_param = false, x.param_buffer_size = 100; })),
        offloaded(1, "llama", F([](DistCase& x) { x.offload = 1.0, x.pin_param = false; })),
        offloaded(2, "gpt2", F([](DistCase& x) { x.offload = 1.0, x.precision = "fp16"; })),
        dist_case(2, 3, "llama", F([](DistCase& x) { x.offload = 1.0, x.optimizer = "adamw"; })),
        dist_case(1, 2, "gpt2", F([](DistCase& x) { x.offload = 0.5, x.offload_buffers = 2; })),
        dist_case(2, 3, "gpt2"), nvme(1, 2, 5000, 6), nvme(2, 3, 3000, 9),
        offloaded(1, "llama", F([](DistCase& x) { x.offload = 1.0, on_nvme(x); })),
        offloaded(2, "gpt2", F([](DistCase& x) { x.param_buffer_size = 100, on_nvme(x); }))}) {
    std::string why;
    if (!dscpp::test::can_run(c, &why)) GTEST_SKIP() << why;
    SCOPED_TRACE(c.name());
    if (!c.nvme_path.empty() && !no_swap.empty()) {
      std::cout << "no NVMe case: " << no_swap << std::endl;
      continue;
    }
    dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
      auto e = dscpp::test::make_engine(c, &pg);
      dscpp::test::train(*e, c, rank, c.gas, 2);
      const DeepSpeedConfig& cfg = e->config();
      TrainingMemorySetup s;
      s.stage = cfg.zero_optimization.stage;
      s.world_size = c.world;
      s.zero = cfg.zero_optimization;
      s.fp32_master = e->mixed_precision();
      s.optimizer_states = int(e->optimizer().state_tensors().size());
      s.gradient_accumulation_steps = c.gas;
      s.offload_ratio = c.offload;
      ActivationWorkload w{dscpp::test::batch(c), dscpp::test::seq(c), DType::f32, e->model().checkpoint_policy(),
                           false};
      const TrainingMemoryEstimate est = estimate_training_memory(dscpp::test::model_config(c), w, s);
      const TierBytes placed = e->placed_bytes();
      EXPECT_EQ(est.placed.gpu, placed.gpu) << e->model_state_report();
      EXPECT_EQ(est.placed.cpu, placed.cpu) << e->model_state_report();
      EXPECT_EQ(est.placed.nvme, placed.nvme);
      EXPECT_EQ(placed.nvme > 0, !c.nvme_path.empty() || !c.param_nvme_path.empty());
      EXPECT_EQ(est.states.host_params, e->model_state_bytes().host_params);
      EXPECT_EQ(placed.cpu > 0, c.offload > 0 || c.offload_param);
      if (e->zero_params()) {
        EXPECT_EQ(est.gathered_params, e->zero_params()->peak_live_elements());
      }
    });
  }
  fs::remove_all(swap);
}

// On GPUs (skipped without them): pinned, pageable and mapped (NVMe) partitions, uploads on the copy stream beside the compute, the
// in-place all-gather after them; compared with the one-process reference within Note [Equivalence tolerances].
namespace {
std::vector<DistCase> nccl_cases() {
  std::vector<DistCase> v;
  auto add = [&](int world, const char* arch, const std::function<void(DistCase&)>& more) {
    v.push_back(dist_case(world, 3, arch, [&](DistCase& c) {
      c.backend = "nccl";
      c.offload_param = true;
      more(c);
    }));
  };
  add(2, "llama", [](DistCase&) {});
  add(2, "gpt2", [](DistCase& c) { c.pin_param = false, c.param_buffer_size = 1000, c.precision = "bf16"; });
  add(2, "llama", [](DistCase& c) { c.offload = 1.0, c.precision = "bf16"; });
  add(1, "gpt2", [](DistCase& c) { c.offload = 1.0, c.precision = "bf16", c.pin_param = false; });
  add(1, "llama", [](DistCase& c) { c.precision = "bf16"; });
  add(1, "llama", [](DistCase& c) { c.offload = 1.0, c.precision = "bf16", on_nvme(c); });
  add(2, "gpt2", [](DistCase& c) { c.precision = "bf16", c.param_buffer_size = 1000, on_nvme(c); });
  return v;
}
}  // namespace

class ParamOffloadNccl : public ::testing::TestWithParam<DistCase> {};

TEST_P(ParamOffloadNccl, MatchesOneProcessWithoutOffload) {
  std::string why;
  if (!dscpp::test::can_run(GetParam(), &why)) GTEST_SKIP() << why;
  dscpp::test::run_equivalence(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Nccl, ParamOffloadNccl, ::testing::ValuesIn(nccl_cases()),
                         [](const auto& i) { return i.param.name(); });
