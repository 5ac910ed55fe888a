// `dscpp train`'s 3D layout (cli/train_parallel.h): --tp / --pp override the config's keys, the checks made before
// any work name the flag, the value and the rule, the loader splits over the data axis only (tensor and pipeline
// peers read the same micro-batches), and the launched job: tensor and pipeline parallelism train, save, and resume
// under another layout; --tp 2, --pp 2 and both train to the losses of one process; layouts that do not fit are
// refused before any work.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "cli/train_parallel.h"
#include "dist/multiprocess.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/core/rng.h"
#include "dscpp/data/shard.h"
#include "dscpp/runtime/training_memory.h"
#include "e2e/cli_workspace.h"

using namespace dscpp;
using namespace dscpp::test;

namespace {

std::string config_error(const std::function<void()>& f, std::string* key = nullptr) {
  try {
    f();
  } catch (const ConfigError& e) {
    if (key) *key = e.key;
    return e.what();
  }
  return "(no error)";
}

// The losses a run printed: each progress line's, then each validation loss.
std::vector<double> printed_losses(const std::string& out) {
  std::vector<double> v;
  for (const std::string key : {"| loss ", "| val loss "})
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + 1))
      v.push_back(std::stod(out.substr(at + key.size())));
  return v;
}

void expect_parts(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
}

TEST(TrainParallel, FlagsOverrideTheConfigKeys) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                      {"tensor_parallel", {{"autotp_size", 4}, {"tp", {{"tp_size", 4}}}}},
                      {"pipeline", {{"stages", 4}, {"partition", "uniform"}}}};
  TrainOptions o;
  o.tp = 2;
  o.pp = 3;
  apply_parallel_flags(j, o);
  const DeepSpeedConfig c = DeepSpeedConfig::parse(j, 12);
  EXPECT_EQ(c.tp_size(), 2);  // the flag, and tp.tp_size 4 no longer disagrees
  EXPECT_EQ(c.pp_size(), 3);
  EXPECT_EQ(c.pipeline.partition, "uniform");  // other keys stay
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_EQ(c.train_batch_size, 4);
  nlohmann::json none = {{"train_batch_size", 8}};
  apply_parallel_flags(none, TrainOptions{});
  EXPECT_FALSE(none.contains("pipeline") || none.contains("tensor_parallel"));
}

TEST(TrainParallel, ChecksNameTheFlagTheValueAndTheRule) {
  ModelConfig m = ModelConfig::preset("gpt2-tiny");
  m.n_head = 6, m.n_kv_head = 2, m.n_ffn = 96, m.n_embd = 48, m.n_layer = 4;
  auto cfg_for = [](int tp, int pp, int world, int virtual_stages = 1) {
    return DeepSpeedConfig::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": )" + std::to_string(tp) +
            R"(}, "pipeline": {"stages": )" + std::to_string(pp) + R"(}, "dscpp": {"pipeline": {"virtual_stages": )" +
            std::to_string(virtual_stages) + "}}}",
        world);
  };
  TrainOptions flags;
  flags.tp = 2;
  flags.pp = 2;
  check_parallel_layout(flags, cfg_for(2, 2, 4), m);  // 6 heads, 2 KV heads, 96 wide, 4 layers: fine
  std::string key;
  expect_parts(config_error([&] { check_parallel_layout(TrainOptions{}, cfg_for(3, 1, 3), m); }, &key),
               {"DeepSpeed config: tensor_parallel degree 3", "model's 2 KV heads (n_kv_head)"});
  EXPECT_EQ(key, "tensor_parallel.autotp_size");
  flags.tp = 4;
  expect_parts(config_error([&] { check_parallel_layout(flags, cfg_for(4, 1, 4), m); }),
               {"--tp 4 does not divide the model's 6 attention heads (n_head)"});
  m.n_head = 8, m.n_kv_head = 4, m.n_ffn = 90;
  expect_parts(config_error([&] { check_parallel_layout(flags, cfg_for(4, 1, 4), m); }),
               {"--tp 4", "90 MLP width (n_ffn)"});
  flags.tp = 0;
  flags.pp = 5;
  expect_parts(config_error([&] { check_parallel_layout(flags, cfg_for(1, 5, 5), m); }, &key),
               {"--pp 5 exceeds the model's 4 layers"});
  EXPECT_EQ(key, "pipeline.stages");
  expect_parts(config_error([&] { check_parallel_layout(TrainOptions{}, cfg_for(1, 2, 2, 3), m); }),
               {"pipeline.stages 2 x dscpp.pipeline.virtual_stages 3 exceeds the model's 4 layers"});
}

// 8 Gloo ranks as pp 2 x dp 2 x tp 2, each building the trainer's groups and its training loader from them: the
// four ranks of one data coordinate read the same batches; the two coordinates read disjoint halves of each global
// batch.
TEST(TrainParallel, LoaderSplitsOverTheDataAxisOnly) {
  const fs::path dir = fs::temp_directory_path() / ("dscpp_train_parallel_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);  // its position: distinct first tokens name distinct sequences
  write_token_shard((dir / "s.bin").string(), tokens, 4000);
  const int world = 8;
  const int64_t B = 2, T = 8, steps = 3;
  expect_all_pass(run_ranks(world, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, std::chrono::seconds(30));
    TrainOptions o;
    o.tp = 2;
    o.pp = 2;
    const DeepSpeedConfig cfg = read_train_config(o, world, nullptr);
    ASSERT_EQ(cfg.dp_world_size, 2);
    const ParallelGroups g = make_train_groups(pg.get(), cfg);
    DataLoaderConfig dc;
    dc.shards = {(dir / "s.bin").string()};
    dc.batch_size = B;
    dc.seq_len = T;
    split_by_data_axis(dc, g);
    DataLoader dl(dc);
    std::ofstream out(dir / ("rank" + std::to_string(rank)), std::ios::binary);
    out << g.data_rank << "\n";
    Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
    for (int s = 0; s < steps; ++s) {
      dl.next_batch(x, y);
      for (int64_t i = 0; i < B; ++i) out << x.data<int32_t>()[i * T] << " ";  // each sequence's first token
      out << "\n";
    }
  }));
  std::map<int, std::string> by_data;  // data coordinate -> its batches
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    int data_rank = -1;
    in >> data_rank;
    EXPECT_EQ(data_rank, (r / 2) % 2) << "rank " << r;  // pipe x data x model, the model axis fastest
    const std::string rest(std::istreambuf_iterator<char>(in), {});
    ASSERT_GT(rest.size(), size_t(steps)) << "rank " << r;
    auto [it, fresh] = by_data.emplace(data_rank, rest);
    if (!fresh) {
      EXPECT_EQ(it->second, rest) << "rank " << r << " reads other batches than its replica's first rank";
    }
  }
  ASSERT_EQ(by_data.size(), 2u);
  std::set<int> firsts;  // both replicas' sequences: 2 x B x steps distinct ones
  for (const auto& [d, text] : by_data) {
    std::istringstream in(text);
    for (int v; in >> v;) firsts.insert(v);
  }
  EXPECT_EQ(firsts.size(), size_t(2 * B * steps));
  fs::remove_all(dir);
}

// The start-up prediction of a run under tp x pp (model_json with the vocabulary `out` printed, --seq-len 32): rank
// 0's, stage 0's figure of the pipeline estimate (Note [Pipeline memory estimate]) that estimate-memory --tp --pp
// prints.
std::string predicted_line(const std::string& model_json, int tp, int pp, const std::string& config,
                           const std::string& out) {
  const size_t at = out.find(", vocab ");
  if (at == std::string::npos) return "(no model line)";
  ModelConfig mc = ModelConfig::from_hf_json(nlohmann::json::parse(read_text(model_json)));
  mc.vocab_size = std::stoll(out.substr(at + 8));
  TrainOptions o;
  o.tp = tp, o.pp = pp, o.config_path = config;
  const DeepSpeedConfig ds = read_train_config(o, tp * pp, nullptr);
  const TrainingMemoryInputs in = training_memory_inputs(mc, ds, 32, /*cuda=*/false);
  const StageMemory s0 = estimate_pipeline_memory(mc, pipeline_layout(ds), in.workload, in.setup).at(0);
  char buf[160];
  std::snprintf(buf, sizeof buf, "memory per rank, predicted (tp %d x pp %d, stage 0): peak %.1f MiB = model states "
                "%.1f MiB", tp, pp, double(s0.peak_bytes()) / (1 << 20), double(s0.states.total()) / (1 << 20));
  return buf;
}

// The MiB of the first "memory per rank, predicted" line's peak.
double predicted_mib(const std::string& out) {
  const size_t at = out.find("memory per rank, predicted");
  const size_t peak = at == std::string::npos ? at : out.find(": peak ", at);
  return peak == std::string::npos ? -1 : std::stod(out.substr(peak + 7));
}

// The launched job: validation before any work; tensor and pipeline parallelism save checkpoints that one process
// resumes, and print the losses one process prints for the same global batch (the tiny model's sums split over 2
// ranks: within float rounding).
TEST(TrainParallelCli, LaunchedTpAndPpSaveForOneProcessAndTrainLikeIt) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  if (!gloo_available()) GTEST_SKIP() << "no gloo in this build";
  CliWorkspace ws("train_parallel");  // a 2-layer model with 2 heads
  auto launch = [&](int n, const std::string& out, const std::string& extra, int* rc, int steps = 1) {
    return run_command(dscpp_binary() + " launch --nproc_per_node " + std::to_string(n) +
                           " --master_port 0 -H /nonexistent" + ws.train_args(out) + " --steps " +
                           std::to_string(steps) + " " + extra,
                       rc);
  };
  int rc = 0;
  std::string out = launch(2, "tp2", "--tp 2", &rc);
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"step     1/1 | loss", "val loss", "checkpoint: "});
  EXPECT_TRUE(fs::exists(ws.dir / "tp2" / "checkpoints" / "global_step1" / "mp_rank_01" / "engine_state.json")) << out;
  const std::string ckpt = (ws.dir / "tp2" / "checkpoints").string();
  out = run_command(dscpp_binary() + " ckpt inspect " + ckpt, &rc);
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"model parallel: 2 parts, tensor-parallel size 2", "mp_rank_01/: ", "all checksums ok"});
  // The whole model from the two slices: a Hugging Face folder.
  out = run_command(dscpp_binary() + " ckpt export " + ckpt + " --format safetensors -o " +
                        (ws.dir / "tp2_hf").string() + " 2>&1",
                    &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(ws.dir / "tp2_hf" / "config.json")) << out;
  out = launch(1, "tp2", "--resume", &rc, 2);  // the same global batch in one process
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"resumed from", "at step 1", "step     2/2 | loss"});

  // TP 2 x PP 2 saves (each stage's slices: 4 parts) and one process resumes it.
  out = launch(4, "tp2pp2save", "--tp 2 --pp 2", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(ws.dir / "tp2pp2save" / "checkpoints" / "global_step1" / "mp_rank_03" / "engine_state.json"))
      << out;
  out = launch(1, "tp2pp2save", "--resume", &rc, 2);
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"resumed from", "at step 1", "step     2/2 | loss"});

  // Two steps of 2 micro-batches (the second step's loss moved by the first's update), evaluated before and after.
  const std::string config = ws.write("gas2.json", R"({"train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 2, "steps_per_print": 1, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}})");
  const std::string run = " --config " + config + " --no-save";
  out = run_command(dscpp_binary() + ws.train_args("one") + " --steps 2" + run, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string one = out;
  const std::vector<double> want = printed_losses(out);
  ASSERT_EQ(want.size(), 4u) << out;
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"tp2run", "--tp 2"}, {"tp2sprun", "--tp 2 --sequence-parallel"}, {"pp2run", "--pp 2"},
           {"tp2pp2run", "--tp 2 --pp 2"}}) {
    const int n = name == "tp2pp2run" ? 4 : 2;
    out = launch(n, name, flags + run, &rc, 2);
    EXPECT_EQ(rc, 0) << out;
    expect_parts(out, {"step     2/2 | loss", "val loss"});
    const bool tp_only = name == "tp2run" || name == "tp2sprun";
    EXPECT_EQ(out.find("sequence parallelism: the residual stream split") != std::string::npos, name == "tp2sprun")
        << out;
    if (!tp_only) expect_parts(out, {"pipeline: 2 stages, partition parameters, 2 micro-batches per step"});
    expect_parts(out, {predicted_line(ws.model, name == "pp2run" ? 1 : 2, tp_only ? 1 : 2, config, out).c_str()});
    EXPECT_LT(predicted_mib(out), predicted_mib(one)) << name << ": a rank holds part of the model";
    const std::vector<double> got = printed_losses(out);
    ASSERT_EQ(got.size(), want.size()) << name << ":\n" << out;
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 2e-4 * want[i]) << name << " loss " << i;
    EXPECT_FALSE(fs::exists(ws.dir / name / "checkpoints" / "latest")) << out;
  }
  // A Hugging Face folder loaded by each stage (its layers; the last stage the tied table's copy) and each tensor
  // slice of it gives the losses of one process loading the whole folder. Its weights are the exported ones moved by
  // noise, so that they differ from the seed's initialisation every run starts from.
  const fs::path moved = ws.dir / "moved_hf";
  fs::create_directories(moved);
  fs::copy_file(ws.dir / "tp2_hf" / "config.json", moved / "config.json");
  std::map<std::string, Tensor> weights = load_safetensors((ws.dir / "tp2_hf" / "model.safetensors").string());
  Rng noise(3);
  for (auto& [name, t] : weights)
    for (int64_t i = 0; i < t.numel(); i++) store_from_float(t, i, load_as_float(t, i) + 0.2f * noise.normal());
  save_safetensors((moved / "model.safetensors").string(), NamedTensors(weights.begin(), weights.end()));
  const std::string hf = " --init-from " + moved.string();
  out = run_command(dscpp_binary() + ws.train_args("onehf") + " --steps 2" + run + hf, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<double> want_hf = printed_losses(out);
  ASSERT_EQ(want_hf.size(), 4u) << out;
  EXPECT_GT(std::fabs(want_hf[2] - want[2]), 1e-3 * want[2]) << "the folder's weights must differ from a fresh model's";
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{{"pp2hf", "--pp 2"},
                                                                                   {"tp2pp2hf", "--tp 2 --pp 2"}}) {
    out = launch(name == "pp2hf" ? 2 : 4, name, flags + run + hf, &rc, 2);
    EXPECT_EQ(rc, 0) << out;
    expect_parts(out, {"initialised from", "step     2/2 | loss"});
    const std::vector<double> got = printed_losses(out);
    ASSERT_EQ(got.size(), want_hf.size()) << name << ":\n" << out;
    for (size_t i = 0; i < want_hf.size(); i++)
      EXPECT_NEAR(got[i], want_hf[i], 2e-4 * want_hf[i]) << name << " loss " << i;
  }

  // One process's checkpoint (a global batch of 1) resumed by 2 data-parallel ranks (a global batch of 2): the data
  // goes on from the sequence it stopped at, and the run says so (Note [Resuming under another global batch]).
  const std::string b1 = ws.write("b1.json", R"({"train_micro_batch_size_per_gpu": 1})");
  out = run_command(dscpp_binary() + ws.train_args("dpgrow") + " --steps 1 --config " + b1, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = launch(2, "dpgrow", "--resume --config " + b1, &rc, 2);
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"at step 1", "note: the checkpoint trained with train_batch_size 1, this run with 2 "
                     "(train_micro_batch_size_per_gpu 1 x gradient_accumulation_steps 1 x 2 data-parallel ranks): "
                     "the data goes on from sequence 1 of epoch 0", "step     2/2 | loss"});

  // PP 2 x DP 2 with ZeRO-1 on GPT-2's tied table (Note [Tied gradients under ZeRO]) trains too.
  const std::string zero1 = ws.write("zero1.json", R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}})");
  out = launch(4, "pp2dp2", "--pp 2 --no-save --config " + zero1, &rc, 2);
  EXPECT_EQ(rc, 0) << out;
  expect_parts(out, {"step     2/2 | loss", "model parallel: pipe=2 x data=2 x model=1", "ZeRO stage 1"});

  out = launch(2, "tp2pp2", "--tp 2 --pp 2", &rc);
  EXPECT_NE(rc, 0) << out;
  expect_parts(out, {"tensor_parallel degree 2 x pipeline.stages 2 = 4 does not divide the world size 2",
                     "--tp 2 sets tensor_parallel.autotp_size, --pp 2 sets pipeline.stages"});
  out = launch(3, "pp3", "--pp 3", &rc);
  EXPECT_NE(rc, 0) << out;
  expect_parts(out, {"--pp 3 exceeds the model's 2 layers"});
  out = launch(3, "tp3", "--tp 3", &rc);
  EXPECT_NE(rc, 0) << out;
  expect_parts(out, {"--tp 3 does not divide the model's 2 attention heads"});
  for (const char* o : {"tp2pp2", "pp3", "tp3"}) EXPECT_FALSE(fs::exists(ws.dir / o / "data")) << o;
}

}  // namespace
