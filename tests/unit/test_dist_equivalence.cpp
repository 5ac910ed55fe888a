// N ranks equal one process (tests/dist/equivalence.h): every ZeRO stage on Gloo ranks (CPU) and on NCCL ranks (one
// GPU each; skipped without them), with the config variants that change how gradients travel: overlap_comm, bucket
// sizes, communication_data_type, copy engines (on Gloo through EngineOptions::copy_engine_over_gloo: the same steps on
// the host), the fused head, the fp16 engine path, bf16 models on the GPU, stage 3's sharded initialisation and its
// gather settings. GPU runs: ctest -R Nccl on a machine with 2 (and 4) GPUs.
#include "dist/equivalence.h"

using dscpp::test::DistCase;

namespace {

using dscpp::test::dist_case;

std::vector<DistCase> gloo_cases() {
  std::vector<DistCase> v;
  auto add = [&](int world, int stage, const char* arch, const std::function<void(DistCase&)>& more = nullptr) {
    v.push_back(dist_case(world, stage, arch, more));
  };
  // Stage 0: buckets (Note [Gradient buckets]), with and without overlap, one or many.
  add(2, 0, "gpt2", [](DistCase& c) { c.overlap = true, c.bucket = 700; });
  add(2, 0, "llama", [](DistCase& c) { c.gas = 3, c.overlap = false, c.bucket = int64_t(1) << 30; });
  add(4, 0, "gpt2", [](DistCase& c) { c.gas = 1, c.overlap = false, c.bucket = 500; });
  add(4, 0, "llama", [](DistCase& c) { c.overlap = true, c.bucket = 300; });
  add(2, 0, "llama", [](DistCase& c) { c.precision = "fp16", c.overlap = true, c.bucket = 500; });
  add(2, 0, "llama", [](DistCase& c) { c.optimizer = "adamw", c.overlap = true, c.bucket = 700; });
  // Stages 1-3 (Note [ZeRO units]).
  for (int stage : {1, 2, 3})
    for (const char* arch : {"gpt2", "llama"}) add(2, stage, arch);
  add(4, 1, "gpt2");
  add(4, 2, "llama");
  add(4, 3, "gpt2");
  add(4, 3, "llama");
  for (int stage : {1, 2, 3}) add(1, stage, "llama");  // one rank is stage 0
  add(2, 3, "gpt2", [](DistCase& c) { c.precision = "fp16"; });
  add(4, 2, "llama", [](DistCase& c) { c.precision = "fp16"; });
  for (int stage : {2, 3})  // without overlap_comm stages 2-3 still reduce each unit as it becomes ready
    add(2, stage, "llama", [](DistCase& c) { c.overlap = false, c.n_layer = 6; });
  add(2, 3, "gpt2", [](DistCase& c) { c.sharded_init = true; });
  add(4, 3, "llama", [](DistCase& c) { c.sharded_init = true; });
  // communication_data_type bf16 at every stage.
  for (int stage : {0, 1, 2, 3}) add(2, stage, "llama", [](DistCase& c) { c.comm = "bf16"; });
  // Note [Copy-engine reductions], Note [Copy-engine ZeRO].
  add(2, 0, "gpt2", [](DistCase& c) { c.overlap = true, c.bucket = 700, c.copy_engine = true; });
  add(4, 0, "llama", [](DistCase& c) { c.overlap = true, c.bucket = 300, c.copy_engine = true; });
  add(4, 0, "gpt2", [](DistCase& c) { c.gas = 1, c.overlap = true, c.bucket = 300, c.copy_engine = true; });
  auto copies = [](DistCase& c) {  // every unit released after its use: the windows fit the arenas
    c.overlap = true, c.copy_engine = true, c.prefetch = 1, c.persistence = 0, c.reuse = 0;
  };
  add(2, 2, "gpt2", copies);
  add(2, 2, "llama", copies);
  add(2, 3, "llama", copies);
  add(4, 3, "gpt2", copies);
  // Units kept for reuse overflow the arena: later gathers fall back to the main group; then no budget at all.
  add(2, 3, "gpt2", [&](DistCase& c) { copies(c), c.reuse = 1000000000, c.n_layer = 6; });
  add(2, 3, "llama", [&](DistCase& c) { copies(c), c.reuse = 1000000000, c.n_layer = 6, c.arena_mib = 0; });
  // Note [Fused head] at every stage (the reference stays unfused).
  for (int stage : {0, 1, 2, 3}) add(2, stage, stage % 2 ? "gpt2" : "llama", [](DistCase& c) { c.fused_head = true; });
  add(4, 3, "gpt2", [](DistCase& c) { c.fused_head = true; });
  add(2, 3, "llama", [](DistCase& c) { c.precision = "fp16", c.fused_head = true; });
  return v;
}

std::vector<DistCase> nccl_cases() {
  std::vector<DistCase> v;
  auto add = [&](int world, int stage, const char* arch, const std::function<void(DistCase&)>& more = nullptr) {
    v.push_back(dist_case(world, stage, arch, [&](DistCase& c) {
      c.backend = "nccl";
      c.bucket = 30000;
      if (more) more(c);
    }));
  };
  for (int world : {2, 4}) {
    for (const char* arch : {"gpt2", "llama"}) {
      for (int stage : {0, 1, 2, 3}) {
        add(world, stage, arch);
        if (stage != 1) add(world, stage, arch, [](DistCase& c) { c.overlap = true, c.copy_engine = true; });
      }
      add(world, 3, arch, [](DistCase& c) { c.precision = "bf16"; });
    }
  }
  add(2, 2, "llama", [](DistCase& c) { c.comm = "bf16"; });
  return v;
}

class Equivalence : public ::testing::TestWithParam<DistCase> {};

TEST_P(Equivalence, NRanksMatchOneProcess) {
  std::string why;
  if (!dscpp::test::can_run(GetParam(), &why)) GTEST_SKIP() << why;
  dscpp::test::run_equivalence(GetParam());
}

std::string case_name(const ::testing::TestParamInfo<DistCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Gloo, Equivalence, ::testing::ValuesIn(gloo_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Nccl, Equivalence, ::testing::ValuesIn(nccl_cases()), case_name);

}  // namespace
