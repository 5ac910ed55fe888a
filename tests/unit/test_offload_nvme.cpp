// NVMe offload of the optimizer (Note [NVMe optimizer states], src/runtime/offload/nvme_states.h) with a temporary
// directory standing in for the NVMe disk. The host step runs the same CPU optimizer on the same values as the run
// without offload (Note [CPU Adam exactness]), only reading its states from swap files and writing them back, so
// an NVMe-offloaded run must equal the plain run BIT FOR BIT: stages 1-3, one and two ranks, with pipeline_read and
// pipeline_write on and off, several sub-groups, Twin-Flow ratios, fp16 loss scaling, SGD, both I/O backends, and
// across save -> resume (sharded and universal) either way between NVMe and not. Also: DeepSpeed's folder layout,
// stale files removed at start and the folder at exit, the disk check and probe, and a full disk (RLIMIT_FSIZE, the
// kernel's own EFBIG) failing with a clear error that leaves no corrupt checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_fixtures.h"
#include "dist/equivalence.h"
#include "dist/offload_checks.h"
#include "swap_fixtures.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/swap/aio_handle.h"
#include "runtime/offload/optimizer_offload.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::dist_case;
using dscpp::test::error_of;
using dscpp::test::expect_bits;
using dscpp::test::floats;
using dscpp::test::train_step;
namespace fs = std::filesystem;

// A build without liburing and libaio refuses device "nvme" (the config test checks how); a temporary folder that
// refuses O_DIRECT cannot stand in for NVMe.
#define SKIP_WITHOUT_AIO() \
  if (const std::string why = dscpp::test::swap_unavailable(temp_root().string()); !why.empty()) GTEST_SKIP() << why

namespace {

fs::path temp_root() {
  static const fs::path p = fs::temp_directory_path() / ("dscpp_nvme_" + std::to_string(::getpid()));
  return p;
}

// A case with its optimizer on "NVMe" under its own folder.
DistCase nvme_case(int world, int stage, const std::string& arch,
                   const std::function<void(DistCase&)>& more = nullptr) {
  return dist_case(world, stage, arch, [&](DistCase& c) {
    c.optimizer = "adamw";
    c.offload = 1.0;
    c.sub_group = 1000;
    if (more) more(c);
    c.nvme_path = (temp_root() / c.name()).string();
    // Adam's sub-group takes 3 buffers; one more sub-group in memory per pipelined direction.
    const int64_t per = c.optimizer == "sgd" ? 2 : 3;
    c.offload_buffers = std::max(c.offload_buffers, per * (1 + int(c.pipeline_read) + int(c.pipeline_write)));
  });
}

DistCase plain(DistCase c) {
  c.offload = 0;
  c.nvme_path.clear();
  return c;
}

std::string read_bytes(const fs::path& p) { return test_fixtures::slurp(p.string()); }

fs::path swap_folder(const DistCase& c, int rank) {
  return fs::path(c.nvme_path) / ("zero_stage_" + std::to_string(c.stage)) / "optimizer" /
         ("rank" + std::to_string(rank));
}

// What a case's engine must hold on "NVMe": DeepSpeed's folder and file names, the states' bytes on disk, nothing of
// them in host memory, and a start-up report that says where they went.
void expect_swap_layout(const Engine& e, const DistCase& c, int rank) {
  const fs::path dir = swap_folder(c, rank);
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  const std::vector<std::string> names = const_cast<Engine&>(e).optimizer().state_names();  // exp_avg, ...
  std::vector<int> per_state(names.size());
  int weights = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string n = f.path().filename().string();
    EXPECT_EQ(n.substr(n.size() - 11), ".tensor.swp") << n;
    EXPECT_EQ(f.file_size() % 4096, 0u) << n;
    const size_t dash = n.find('-');
    if (dash == std::string::npos) {
      weights++;
      EXPECT_NE(n.find('_'), std::string::npos) << n << ": <first>_<last>.tensor.swp";
      continue;
    }
    auto it = std::find(names.begin(), names.end(), n.substr(0, dash));
    ASSERT_NE(it, names.end()) << n << ": <state>-<first>_<last>.tensor.swp";
    per_state[size_t(it - names.begin())]++;
  }
  EXPECT_GT(weights, 1) << "several sub-groups";
  for (size_t k = 0; k < names.size(); k++) EXPECT_EQ(per_state[k], weights) << names[k];
  const ModelStateBytes b = e.model_state_bytes(), t = e.theoretical_model_state_bytes();
  EXPECT_EQ(b.host, 0);
  EXPECT_GE(b.nvme, t.host) << e.model_state_report();
  EXPECT_LT(b.nvme, t.host + int64_t(1 + names.size()) * 4096 * weights) << "padding to 4096 bytes per file at most";
  const std::string report = e.model_state_report();
  for (const std::string& part : {std::string("on NVMe"), dir.string(), std::string("NVMe ")})
    EXPECT_NE(report.find(part), std::string::npos) << report;
}

std::vector<DistCase> exact_cases() {
  std::vector<DistCase> v;
  v.push_back(nvme_case(1, 1, "gpt2"));
  v.push_back(nvme_case(1, 2, "llama", [](DistCase& c) { c.pipeline_read = true; }));
  v.push_back(nvme_case(1, 3, "gpt2", [](DistCase& c) { c.pipeline_write = true; }));
  v.push_back(nvme_case(1, 3, "llama", [](DistCase& c) {
    c.pipeline_read = c.pipeline_write = true, c.offload = 0.5;
  }));
  v.push_back(nvme_case(1, 2, "gpt2", [](DistCase& c) {
    c.precision = "fp16", c.pipeline_read = c.pipeline_write = true, c.sub_group = 700;
  }));
  v.push_back(nvme_case(1, 1, "llama", [](DistCase& c) { c.optimizer = "sgd", c.pipeline_read = true; }));
  v.push_back(nvme_case(2, 1, "llama"));
  v.push_back(nvme_case(2, 2, "gpt2", [](DistCase& c) { c.pipeline_read = c.pipeline_write = true, c.offload = 0.6; }));
  v.push_back(nvme_case(2, 3, "llama", [](DistCase& c) {
    c.pipeline_read = c.pipeline_write = true, c.sub_group = 500;
  }));
  v.push_back(nvme_case(2, 3, "gpt2", [](DistCase& c) { c.precision = "fp16", c.pipeline_write = true, c.gas = 1; }));
  return v;
}

// Runs fn on the case's ranks: in this process for one rank (no Gloo needed), forked over Gloo for more.
bool run_case(const DistCase& c, const std::function<void(ProcessGroup*, int)>& fn, std::string* why) {
  if (*why = dscpp::test::swap_unavailable(temp_root().string()); !why->empty()) return false;
  if (c.world == 1) {
    fn(nullptr, 0);
    return true;
  }
  if (!dscpp::test::can_run(c, why)) return false;
  dscpp::test::on_ranks(c, [&](ProcessGroup& pg, int rank) { fn(&pg, rank); });
  return true;
}

}  // namespace

// ---- configuration ------------------------------------------------------------------------------------------------

namespace {
DeepSpeedConfig parse(const std::string& body, std::vector<std::string>* w = nullptr) {
  return DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 2, )" + body + "}", 1, w);
}

void expect_config_error(const std::string& body, const std::string& key, const std::vector<std::string>& parts) {
  try {
    parse(body);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, key) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

const std::string kNvme = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
    "nvme_path": "/local_nvme")";
}  // namespace

TEST(OffloadNvmeConfig, DeepSpeedKeysDefaultsAndRules) {
  if (!aio_missing_libraries().empty()) {  // a build without liburing and libaio refuses "nvme", naming them
    expect_config_error(kNvme + "}}", "zero_optimization.offload_optimizer.device", {"liburing", "libaio"});
    GTEST_SKIP() << aio_missing_libraries();
  }
  std::vector<std::string> w;
  const DeepSpeedConfig c = parse(kNvme + "}}", &w);
  EXPECT_TRUE(w.empty()) << w[0];
  const OffloadOptimizerConfig& o = *c.zero_optimization.offload_optimizer;
  EXPECT_EQ(o.device, "nvme");
  EXPECT_EQ(*o.nvme_path, "/local_nvme");
  EXPECT_EQ(o.buffer_count, 4);
  EXPECT_FALSE(o.pipeline_read || o.pipeline_write || o.fast_init);
  EXPECT_EQ(c.aio.block_size, 1048576);  // DeepSpeed's code defaults
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_EQ(c.dscpp.offload.aio_backend, "auto");
  EXPECT_EQ(c.dscpp.offload.nvme_probe_mib, 256);
  EXPECT_EQ(c.dscpp.offload.nvme_min_gbps, 1.0);
  // Every key round-trips and so reaches the start-up agreement; thread_count is intra_op_parallelism's old name.
  const DeepSpeedConfig all = parse(kNvme + R"(, "buffer_count": 9, "pipeline_read": true, "pipeline_write": true,
      "fast_init": true}, "sub_group_size": 5000}, "aio": {"block_size": 8192, "queue_depth": 32, "thread_count": 4,
      "single_submit": true, "overlap_events": false, "use_gds": false},
      "dscpp": {"offload": {"aio_backend": "libaio", "nvme_probe_mib": 0, "nvme_min_gbps": 2.5}})", &w);
  EXPECT_TRUE(w.empty()) << w[0] << " (aio is a section we read now)";
  EXPECT_EQ(all.aio.intra_op_parallelism, 4);
  EXPECT_EQ(all.aio.block_size, 8192);
  EXPECT_EQ(DeepSpeedConfig::parse(all.to_json(), 1).canonical_dump(), all.canonical_dump());
  bool agreed = false;
  for (const auto& [k, v] : agreement_settings(all, test_fixtures::tiny_model_config()))
    agreed |= k == "aio.intra_op_parallelism" && v == "4";
  EXPECT_TRUE(agreed);

  expect_config_error(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}})",
                      "zero_optimization.offload_optimizer.nvme_path", {"required", "\"nvme\""});
  expect_config_error(kNvme + "}}, \"aio\": {\"block_size\": 1000}", "aio.block_size", {"1000", "multiple of 4096"});
  expect_config_error(kNvme + "}}, \"aio\": {\"queue_depth\": 0}", "aio.queue_depth", {"0", ">= 1"});
  expect_config_error(kNvme + "}}, \"aio\": {\"thread_count\": 2, \"intra_op_parallelism\": 2}", "aio.thread_count",
                      {"only one", "intra_op_parallelism"});
  expect_config_error(kNvme + "}}, \"aio\": {\"use_gds\": true}", "aio.use_gds", {"true", "GPUDirect"});
  expect_config_error(kNvme + "}}, \"aio\": {\"blok_size\": 8192}", "aio.blok_size", {"did you mean 'block_size'"});
  expect_config_error(kNvme + "}}, \"dscpp\": {\"offload\": {\"aio_backend\": \"spdk\"}}", "dscpp.offload.aio_backend",
                      {"spdk", "io_uring"});
  expect_config_error(kNvme + "}}, \"dscpp\": {\"offload\": {\"nvme_min_gbps\": -1}}", "dscpp.offload.nvme_min_gbps",
                      {"-1"});
  // buffer_count counts buffers of the largest sub-group, as DeepSpeed's: AdamW's sub-group takes 3 of them.
  expect_config_error(kNvme + ", \"buffer_count\": 2}}", "zero_optimization.offload_optimizer.buffer_count",
                      {"= 2", "3 buffers", "at least 3"});
  expect_config_error(kNvme + ", \"pipeline_read\": true, \"pipeline_write\": true}}",
                      "zero_optimization.offload_optimizer.buffer_count",
                      {"= 4", "the next being read", "the last being written", "at least 9"});
  EXPECT_NO_THROW(parse(kNvme + R"(, "buffer_count": 2, "pipeline_read": true}},
      "optimizer": {"type": "sgd", "params": {"lr": 0.1}})"));  // SGD without momentum keeps no state
  expect_config_error(kNvme + "}}, \"dscpp\": {\"offload\": {\"delayed_update\": true}}",
                      "dscpp.offload.delayed_update", {"\"cpu\", not \"nvme\""});
  expect_config_error(kNvme + "}, \"sub_group_size\": 0}", "zero_optimization.sub_group_size", {"0", ">= 1", "nvme"});
  expect_config_error(R"("zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})",
                      "zero_optimization.offload_optimizer.device", {"stage 1, 2 or 3"});
}

// ---- offloaded to NVMe equals not offloaded, bit for bit ----------------------------------------------------------

class OffloadNvmeExact : public ::testing::TestWithParam<DistCase> {};

TEST_P(OffloadNvmeExact, EqualsTheSameRunWithoutOffload) {
  const DistCase c = GetParam();
  std::string why;
  const bool ran = run_case(c, [&](ProcessGroup* pg, int rank) {
    std::vector<float> got, init;
    {
      auto e = dscpp::test::make_engine(c, pg);
      ASSERT_NE(e->offload(), nullptr);
      ASSERT_NE(e->offload()->nvme(), nullptr);
      expect_swap_layout(*e, c, rank);
      const auto t = dscpp::test::train(*e, c, rank, c.gas, 4);
      got = t.params, init = t.init;
      const DistCase p = plain(c);
      auto r = dscpp::test::make_engine(p, pg);
      const auto want = dscpp::test::train(*r, p, rank, p.gas, 4);
      const std::string what = c.name() + " rank " + std::to_string(rank);
      expect_bits(t.losses, want.losses, what + ": losses");
      expect_bits(t.norms, want.norms, what + ": gradient norms");
      expect_bits(got, want.params, what + ": parameters after 4 steps");
      EXPECT_NE(got, init) << what << ": nothing trained";
      EXPECT_EQ(e->optimizer().step_count(), r->optimizer().step_count());
      if (c.precision == "fp16")
        expect_bits(floats(e->master_params()), floats(r->master_params()), what + ": masters");
    }
    EXPECT_FALSE(fs::exists(swap_folder(c, rank))) << "the swap folder is removed at a clean exit";
  }, &why);
  if (!ran) GTEST_SKIP() << why;
}

INSTANTIATE_TEST_SUITE_P(Cases, OffloadNvmeExact, ::testing::ValuesIn(exact_cases()),
                         [](const auto& i) { return i.param.name(); });

// Both I/O backends carry the same run (auto already took io_uring where it runs).
TEST(OffloadNvme, EachBackendGivesTheSameRun) {
  SKIP_WITHOUT_AIO();
  for (const std::string backend : {"io_uring", "libaio"}) {
    try {
      AioHandle probe(AioConfig{}, backend);
    } catch (const Error& e) {
      std::cout << "[  SKIPPED ] " << backend << " cannot run here: " << e.what() << std::endl;
      continue;
    }
    DistCase c = nvme_case(1, 2, "llama", [](DistCase& x) { x.pipeline_read = x.pipeline_write = true; });
    c.aio_backend = backend;
    auto e = dscpp::test::make_engine(c, nullptr);
    EXPECT_EQ(aio_backend_name(e->offload()->nvme()->backend()), backend);
    const auto got = dscpp::test::train(*e, c, 0, c.gas, 3).params;
    expect_bits(got, dscpp::test::train(*dscpp::test::make_engine(plain(c), nullptr), plain(c), 0, c.gas, 3).params,
                backend);
  }
}

// fast_init: the states start as the reserved files' zeros instead of written zeros; the run is the same.
TEST(OffloadNvme, FastInitGivesTheSameRun) {
  SKIP_WITHOUT_AIO();
  const DistCase c = nvme_case(1, 3, "gpt2", [](DistCase& x) { x.pipeline_read = true, x.sub_group = 2000; });
  std::string j = dscpp::test::config_json(c);
  const std::string at = R"("pipeline_write": false)";
  j.replace(j.find(at), at.size(), at + R"(, "fast_init": true)");
  const DeepSpeedConfig cfg = DeepSpeedConfig::from_string(j, 1);
  ASSERT_TRUE(cfg.zero_optimization.offload_optimizer->fast_init);
  auto m = make_model(dscpp::test::model_config(c));
  m->init_weights(42);
  auto e = initialize(std::move(m), cfg);
  expect_bits(dscpp::test::train(*e, c, 0, c.gas, 3).params,
              dscpp::test::train(*dscpp::test::make_engine(plain(c), nullptr), plain(c), 0, c.gas, 3).params,
              "fast_init");
}

// Checkpoints hold the same tensors as without offload: the shard files are byte-identical, a resume continues bit
// for bit either way between NVMe and not, and a universal tag of an NVMe run loads into one NVMe process.
TEST(OffloadNvme, CheckpointsAreTheSameAsWithoutOffload) {
  SKIP_WITHOUT_AIO();
  for (const DistCase& c : {nvme_case(1, 2, "llama", [](DistCase& x) { x.precision = "fp16", x.pipeline_read = true; }),
                            nvme_case(2, 3, "gpt2", [](DistCase& x) { x.pipeline_write = true, x.offload = 0.5; })}) {
    SCOPED_TRACE(c.name());
    const fs::path off_dir = temp_root() / ("ckpt_" + c.name() + "_off");
    const fs::path plain_dir = temp_root() / ("ckpt_" + c.name() + "_plain");
    std::string why;
    const bool ran = run_case(c, [&](ProcessGroup* pg, int rank) {
      auto e = dscpp::test::make_engine(c, pg), r = dscpp::test::make_engine(plain(c), pg);
      for (int64_t s = 0; s < 2; s++) train_step(*e, c, rank, s), train_step(*r, c, rank, s);
      e->save_checkpoint(off_dir.string());
      r->save_checkpoint(plain_dir.string());
      const auto want = dscpp::test::train(*e, c, rank, c.gas, 2, 2).params;
      const std::string shard =
          c.world > 1 ? "zero/rank_" + std::to_string(rank) + ".safetensors" : "optim_states.safetensors";
      const std::string a = read_bytes(off_dir / "global_step2" / shard);
      const std::string b = read_bytes(plain_dir / "global_step2" / shard);
      EXPECT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << shard << " differs with NVMe offload";
      e.reset();  // its swap folder goes; the resumed engines make their own
      for (const auto& [from, nvme] : {std::pair{off_dir, true}, {off_dir, false}, {plain_dir, true}}) {
        auto x = dscpp::test::make_engine(nvme ? c : plain(c), pg);
        x->load_checkpoint(from.string());
        EXPECT_EQ(x->global_steps(), 2);
        expect_bits(dscpp::test::train(*x, c, rank, c.gas, 2, 2).params, want,
                    std::string("resumed ") + (nvme ? "on NVMe" : "plain") + " from " + from.filename().string());
      }
    }, &why);
    if (!ran) {
      std::cout << "[  SKIPPED ] " << c.name() << ": " << why << std::endl;
      continue;
    }
    if (c.world == 1) continue;
    convert_to_universal(off_dir.string(), "", "", "");
    DistCase one = nvme_case(1, 3, "gpt2", [&](DistCase& x) { x.gas = c.gas * 2, x.offload = 0.5, x.sub_group = 800; });
    std::vector<std::vector<float>> got;
    for (const DistCase& x : {one, plain(one)}) {
      auto e = dscpp::test::make_engine(x, nullptr);
      e->load_checkpoint(off_dir.string(), "global_step2_universal");
      got.push_back(dscpp::test::train(*e, x, 0, x.gas, 2, 2).params);
    }
    expect_bits(got[0], got[1], "universal resume, NVMe against not");
  }
}

// ---- the disk -----------------------------------------------------------------------------------------------------

// A killed run's files are removed at start; the report and the probe; a disk too small is refused before training
// with the bytes needed and free; a slow one is a warning with its numbers.
TEST(OffloadNvme, StartUpCleansChecksAndProbesTheDisk) {
  SKIP_WITHOUT_AIO();
  DistCase c = nvme_case(1, 2, "gpt2");
  const fs::path stale = swap_folder(c, 0) / "0_99.tensor.swp";
  fs::create_directories(stale.parent_path());
  std::ofstream(stale) << "left by a killed run";
  {
    auto e = dscpp::test::make_engine(c, nullptr);
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_TRUE(e->offload()->nvme()->notices().empty() || e->offload()->nvme()->notices()[0].find("io_uring") !=
                std::string::npos);
  }
  auto with = [&](const std::string& ours) {
    std::string j = dscpp::test::config_json(c);
    j.replace(j.find(R"("nvme_probe_mib": 0)"), 19, ours);
    return DeepSpeedConfig::from_string(j, 1);
  };
  auto engine = [&](const DeepSpeedConfig& cfg) {
    auto m = make_model(dscpp::test::model_config(c));
    m->init_weights(42);
    return initialize(std::move(m), cfg);
  };
  {  // a probe of 1 MiB below an impossible floor: a warning with the numbers, the rates in the report
    auto e = engine(with(R"("nvme_probe_mib": 1, "nvme_min_gbps": 100000)"));
    const NvmeStates* n = e->offload()->nvme();
    EXPECT_EQ(n->speed().bytes, 1 << 20);
    EXPECT_GT(n->speed().read_gbps, 0.0);
    ASSERT_FALSE(n->notices().empty());
    const std::string& warning = n->notices().back();
    for (const char* part : {"is slow", "GB/s", "dscpp.offload.nvme_min_gbps 100000", "each step reads and writes"})
      EXPECT_NE(warning.find(part), std::string::npos) << warning;
    EXPECT_NE(e->model_state_report().find("probe write"), std::string::npos) << e->model_state_report();
  }
  // More than the disk has (the probe asks for 1 TiB on top): refused, naming the key, the bytes and the free space.
  const std::string e = error_of([&] { engine(with(R"("nvme_probe_mib": 1048576)")); });
  for (const char* part : {"zero_optimization.offload_optimizer.nvme_path", "swap files need", "GiB", "free"})
    EXPECT_NE(e.find(part), std::string::npos) << e;
}

// A full disk, twice, in a child process under RLIMIT_FSIZE (writes past it fail in the kernel with EFBIG, as a full
// disk fails with ENOSPC): (1) the checkpoint's files do not fit: the save fails by name, no tag appears, training
// goes on and a later save is whole; (2) the swap files' writes fail mid-step: the next use of the states fails
// naming the swap file, and a save after it is refused, so no checkpoint of half-updated states exists. The parent
// then resumes from the last good tag and gets the plain run's parameters.
TEST(OffloadNvme, AFullDiskFailsClearlyAndLeavesNoCorruptCheckpoint) {
  SKIP_WITHOUT_AIO();
  const DistCase c = nvme_case(1, 2, "gpt2", [](DistCase& x) { x.sub_group = 3000; });
  const fs::path dir = temp_root() / "full_disk_ckpt";
  fs::remove_all(dir);
  const int status = dscpp::test::child_exit_code([&] {
    int code = 0;
    auto check = [&](bool ok, int fail_code, const std::string& what) {
      if (!ok && !code) code = fail_code, std::fprintf(stderr, "child: %s\n", what.c_str());
    };
    try {
      ::signal(SIGXFSZ, SIG_IGN);
      omp_set_num_threads(1);  // the parent's OpenMP pool does not exist in this process
      auto e = dscpp::test::make_engine(c, nullptr);
      train_step(*e, c, 0, 0);
      e->save_checkpoint(dir.string());  // global_step1
      train_step(*e, c, 0, 1);
      // The swap files are 12 KiB at most; the checkpoint's optimizer file is bigger than 64 KiB.
      rlimit lim{};
      ::getrlimit(RLIMIT_FSIZE, &lim);
      const rlimit small{rlim_t(64 << 10), lim.rlim_max};
      ::setrlimit(RLIMIT_FSIZE, &small);
      const std::string ckpt = error_of([&] { e->save_checkpoint(dir.string()); });
      check(ckpt.find("File too large") != std::string::npos, 3, "checkpoint error: " + ckpt);
      check(read_latest_tag(dir.string()) == "global_step1", 4, "latest moved after a failed save");
      check(!fs::exists(dir / "global_step2"), 4, "a failed save left global_step2");
      train_step(*e, c, 0, 2);  // the swap files were not touched by the limit
      ::setrlimit(RLIMIT_FSIZE, &lim);
      e->save_checkpoint(dir.string());  // global_step3, whole
      const rlimit tiny{rlim_t(4096), lim.rlim_max};  // now every swap file's second block fails
      ::setrlimit(RLIMIT_FSIZE, &tiny);
      const std::string step = error_of([&] { train_step(*e, c, 0, 3), train_step(*e, c, 0, 4); });
      check(step.find("NVMe offload") != std::string::npos && step.find(".tensor.swp") != std::string::npos &&
                (step.find("File too large") != std::string::npos || step.find("only 4096 bytes") != std::string::npos),
            5, "swap error: " + step);
      ::setrlimit(RLIMIT_FSIZE, &lim);
      const std::string save = error_of([&] { e->save_checkpoint(dir.string()); });
      check(save.find("restart from the last checkpoint") != std::string::npos, 6, "save after it: " + save);
      check(read_latest_tag(dir.string()) == "global_step3", 7, "latest is not global_step3");
    } catch (const std::exception& x) {
      std::fprintf(stderr, "child: unexpected %s\n", x.what());
      code = 8;
    }
    return code;
  });
  ASSERT_EQ(status, 0) << "the child's line above says what went wrong";
  // The last good tag resumes exactly: three steps, then two more, as the plain run.
  auto e = dscpp::test::make_engine(c, nullptr);
  e->load_checkpoint(dir.string());
  EXPECT_EQ(e->global_steps(), 3);
  const auto got = dscpp::test::train(*e, c, 0, c.gas, 2, 3).params;
  auto r = dscpp::test::make_engine(plain(c), nullptr);
  for (int64_t s = 0; s < 3; s++) train_step(*r, plain(c), 0, s);
  expect_bits(got, dscpp::test::train(*r, plain(c), 0, c.gas, 2, 3).params, "resumed from the last good tag");
  fs::remove_all(dir);
}

// On GPUs (skipped without them): the copy streams, page-locked swap buffers and events for real; compared with the
// one-process reference within Note [Equivalence tolerances] (SGD).
namespace {
std::vector<DistCase> nccl_cases() {
  std::vector<DistCase> v;
  for (int world : {1, 2})
    v.push_back(nvme_case(world, world == 1 ? 2 : 3, "llama", [](DistCase& c) {
      c.backend = "nccl", c.optimizer = "sgd", c.precision = "bf16", c.pipeline_read = c.pipeline_write = true;
      c.sub_group = 20000;
    }));
  return v;
}
}  // namespace

class OffloadNvmeNccl : public ::testing::TestWithParam<DistCase> {};

TEST_P(OffloadNvmeNccl, MatchesOneProcessWithoutOffload) {
  SKIP_WITHOUT_AIO();
  std::string why;
  if (!dscpp::test::can_run(GetParam(), &why)) GTEST_SKIP() << why;
  dscpp::test::run_equivalence(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Nccl, OffloadNvmeNccl, ::testing::ValuesIn(nccl_cases()),
                         [](const auto& i) { return i.param.name(); });

class CleanUp : public ::testing::Environment {
  void TearDown() override { fs::remove_all(temp_root()); }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);
