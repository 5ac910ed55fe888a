#include "cli/trainer.h"

#include "cli/train_parallel.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iomanip>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/random_fill.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/data/dataloader.h"
#include "dscpp/data/shard.h"
#include "dscpp/data/train_data.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/inference/sampler.h"
#include "dscpp/runtime/engine.h"
#include "dscpp/runtime/pipe_engine.h"
#include "dscpp/runtime/training_memory.h"

namespace fs = std::filesystem;

namespace dscpp {

std::string train_default_config(int64_t steps, const std::string& device) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 16},
      {"gradient_accumulation_steps", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"betas", {0.9, 0.95}}, {"eps", 1e-8},
                                                    {"weight_decay", 0.1}}}}},
      {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", std::min<int64_t>(40, steps / 5 + 1)},
                                                            {"total_num_steps", steps}, {"warmup_min_ratio", 0.0},
                                                            {"cos_min_ratio", 0.1}}}}},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 10},
  };
  // DeepSpeed's own default is f32, but a GPU user who passes no config wants the tensor cores: f32 on an H100 runs
  // GPT-2 124M ~25x slower than bf16. A --config keeps DeepSpeed's meaning of every key, f32 included.
  if (device == "cuda") j["bf16"] = {{"enabled", true}};
  return j.dump(2);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string fmt_bytes(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1024.0 * 1024.0));
  return buf;
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DSCPP_CHECK(in.good(), "cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What this run does with the checkpoints already in --out, decided before any work: a fresh run never replaces
// another run's tags unasked, and a resume never quietly starts over. Returns the tag to resume from ("" = none).
std::string plan_checkpoints(const TrainOptions& o, const std::string& ckpt_dir, bool universal, bool quiet,
                             std::ostream& log) {
  if (o.resume && o.overwrite)
    DSCPP_FAIL("--resume and --overwrite: choose one (continue the run in ", ckpt_dir, ", or delete it and start over)");
  if (!o.resume) {
    const std::vector<std::string> tags = list_tags(ckpt_dir);
    if (tags.empty() || o.overwrite) return "";
    std::string names;
    for (const auto& t : tags) names += (names.empty() ? "" : ", ") + t;
    DSCPP_FAIL("--out ", o.out_dir, " holds the checkpoints of an earlier run (", ckpt_dir, ": ", names,
               "), which this run would replace: pass --resume to continue it, another --out to start a new run "
               "beside it, or --overwrite to delete them and start over");
  }
  if (universal) return read_latest_universal_tag(ckpt_dir);
  std::string note;
  const std::string tag = find_resume_tag(ckpt_dir, &note);
  if (tag.empty())
    DSCPP_FAIL("--resume: nothing to resume: ", note, ". Drop --resume to start a new run, or give the --out of the "
               "run to continue");
  if (!note.empty() && !quiet) log << "warning: " << note << std::endl;
  return tag;
}

// A resumed model's token ids mean what its checkpoint's tokenizer says: refuse another (a cache rebuilt for new
// --data, another --vocab-size or --tokenizer).
void check_resume_tokenizer(const std::string& ckpt_dir, const std::string& tag, const TrainData& data) {
  CheckpointReader r(ckpt_dir, tag, /*verify_crc=*/false);  // the load verifies everything
  if (!r.has_file("tokenizer.json")) return;
  const std::string saved_path = r.dir() + "/tokenizer.json";
  const Tokenizer saved = Tokenizer::load_hf(saved_path);
  if (saved.fingerprint() == data.tokenizer.fingerprint()) return;
  DSCPP_FAIL("--resume: ", r.dir(), " was trained with the tokenizer in ", saved_path, " (", saved.vocab_size(),
             " tokens), but this run's tokenizer is ", data.tokenizer_path, " (", data.tokenizer.vocab_size(),
             " tokens; another --data, --vocab-size or --tokenizer makes another): the model's token ids would mean "
             "other text. Resume with the run's own data and settings, or tokenize new text with the checkpoint's "
             "tokenizer (dscpp tokenize --tokenizer ", saved_path, " --save-tokenizer DIR/tokenizer.json -o DIR "
             "TEXT...) and resume with --data DIR/*.bin --tokenizer DIR/tokenizer.json");
}

// The refusals that need no data, made before the process group, the tokenizer and the data cache, so that a run
// that cannot start says so at once, naming the user's key or flag.
void check_before_work(const TrainOptions& o, const DeepSpeedConfig& cfg, const ModelConfig& mcfg) {
  if (o.device == "cpu" && (cfg.fp16.enabled || cfg.bf16.enabled)) {
    const std::string sec = cfg.fp16.enabled ? "fp16" : "bf16";
    throw ConfigError(sec + ".enabled", "DeepSpeed config: " + sec + ".enabled = true needs --device cuda: the CPU "
                      "kernels are f32 only (set \"" + sec + "\": {\"enabled\": false} to train in f32 on the CPU)");
  }
  if (o.device == "cuda" && cuda_device_count() == 0)
    DSCPP_FAIL("--device cuda: no CUDA device is visible to this process (or this build has no CUDA); use "
               "--device cpu");
  DSCPP_CHECK(o.seq_len <= mcfg.max_seq_len, "--seq-len ", o.seq_len, " exceeds the model's context length ",
              mcfg.max_seq_len);
  if (cfg.autotuning.enabled && o.steps < cfg.autotuning.end_profile_step)
    throw ConfigError("autotuning.end_profile_step", "autotuning.end_profile_step = " +
                      std::to_string(cfg.autotuning.end_profile_step) + " needs --steps >= it (got " +
                      std::to_string(o.steps) + "): the run ends at that step with its metrics");
  mcfg.validate();
  check_parallel_layout(o, cfg, mcfg);
  const int tp = cfg.tp_size(), pp = cfg.pp_size();
  const std::string flags = (tp > 1 ? "--tp " + std::to_string(tp) : "") + (tp > 1 && pp > 1 ? " " : "") +
                            (pp > 1 ? "--pp " + std::to_string(pp) : "");
  if (tp > 1 && cfg.dscpp.fused_head)
    throw ConfigError("dscpp.fused_head", "dscpp.fused_head = true with " + flags + ": the fused head does not "
                      "split the vocabulary; set it false");
  if (pp > 1) {
    check_pipeline_config(cfg, pp, int(cfg.dscpp.pipeline.virtual_stages));
    if (cfg.activation_checkpointing.cpu_checkpointing)
      throw ConfigError("activation_checkpointing.cpu_checkpointing", "activation_checkpointing.cpu_checkpointing = "
                        "true with " + flags + ": not supported on a pipeline stage (Note [Pipeline stage]); set it "
                        "false");
  }
}

// Tests only (TrainOptions::fault, which `dscpp train` takes from DSCPP_TRAIN_FAULT): the run crashes (abort), hangs,
// or fails as out of memory at its first step, as a real one might; the autotuner's trial tests set it for chosen
// trials (Note [Trial faults], src/autotune/trial_runner.cpp).
void inject_train_fault(const std::string& what) {
  if (what.empty()) return;
  if (what == "crash") {
    std::fprintf(stderr, "DSCPP_TRAIN_FAULT=crash: aborting\n");
    std::abort();
  }
  if (what == "hang")
    for (;;) pause();
  if (what == "oom") DSCPP_FAIL("CUDA out of memory on cuda:0: asked for 1073741824 bytes (DSCPP_TRAIN_FAULT=oom)");
  DSCPP_FAIL("DSCPP_TRAIN_FAULT=", what, ": expected crash, hang or oom");
}

// The mean validation loss over the same batches every time. A pipeline evaluates them all as one eval_batch (a
// collective over the pipeline), a multiple of the stages under interleaving (eval_batch's rule).
float evaluate(Engine& engine, PipelineEngine* pipe, DataLoader& val, int64_t batches, int64_t B, int64_t T) {
  val.set_state({0, 0, val.state().seed});
  int64_t n = std::min<int64_t>(batches, std::max<int64_t>(val.batches_per_epoch(), 1));
  const int64_t p = pipe ? pipe->num_stages() : 1;
  if (pipe && engine.config().dscpp.pipeline.virtual_stages > 1) n = std::max(p, n - n % p);
  PipelineEngine::MicroBatches mbs;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
    val.next_batch(x, y);
    if (pipe) mbs.push_back({x, y});
    else sum += engine.model().forward(x, y);
  }
  return pipe ? pipe->eval_batch(mbs) : float(sum / double(n));
}

}  // namespace

ModelConfig train_model_config(const TrainOptions& o) {
  if (!o.init_from.empty()) return read_hf_config(o.init_from);
  if (fs::exists(o.model)) return ModelConfig::from_hf_json(nlohmann::json::parse(read_file(o.model)));
  return ModelConfig::preset(o.model);
}

TrainResult run_training(const TrainOptions& o, std::ostream& log) {
  TrainResult res;
  DSCPP_CHECK(o.steps > 0, "--steps must be > 0 (got ", o.steps, ")");
  DSCPP_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda (got '", o.device, "')");
  // 1. Config first: every config error is reported before any work starts. Under `dscpp launch` (or torchrun,
  // mpirun, srun) the batch sizes resolve with the data-parallel world size.
  const DistEnv env = read_dist_env();
  const int world = env.world_size, rank = env.rank;
  const bool quiet = o.quiet || rank != 0;  // only rank 0 prints
  std::vector<std::string> warnings;
  DeepSpeedConfig cfg = read_train_config(o, world, &warnings);  // --tp / --pp applied: dp = world / (tp x pp)
  if (!quiet)
    for (const auto& w : warnings) log << "warning: " << w << std::endl;
  if (o.seed) cfg.seed = o.seed;
  ModelConfig mcfg = train_model_config(o);
  check_before_work(o, cfg, mcfg);

  const std::string ckpt_dir = (fs::path(o.out_dir) / "checkpoints").string();
  res.checkpoint_dir = ckpt_dir;
  const std::string resume_tag = plan_checkpoints(o, ckpt_dir, cfg.checkpoint.load_universal, quiet, log);

  // Data parallel: the process group (the ranks meet through the store on MASTER_ADDR:MASTER_PORT). Ranks started
  // with different configs, models or flags stop here, before any work, naming the difference (Note [Start-up
  // agreement]); the engine checks again with the model as built.
  const int64_t T = o.seq_len ? o.seq_len : mcfg.max_seq_len;
  const Settings flags = {{"--steps", std::to_string(o.steps)},
                          {"--seq-len", std::to_string(T)},
                          {"--save-every", std::to_string(o.save_every)},
                          {"--no-save", o.no_save ? "true" : "false"},
                          {"--eval-every", std::to_string(o.eval_every)},
                          {"--samples", std::to_string(o.num_samples)},
                          {"--resume", o.resume ? "true" : "false"},
                          {"--overwrite", o.overwrite ? "true" : "false"},
                          {"--activation-checkpointing", o.activation_checkpointing ? "true" : "false"},
                          {"--device", o.device}};
  std::unique_ptr<ProcessGroup> pg;
  if (world > 1) {
    pg = init_process_group(o.device == "cuda" ? "nccl" : "gloo");
    check_same_settings(*pg, *pg->store(), agreement_settings(cfg, mcfg, flags));
  }
  // The pipe x data x model layout (comm/topology.h): the data axis goes to the engine (ZeRO) and the loader, the
  // model axis (groups.model) to tensor parallelism, the pipe axis (groups.pipe, groups.stage) to the pipeline, and
  // groups.model_parallel to the global gradient norm.
  const ParallelGroups groups = make_train_groups(pg.get(), cfg);
  const int dp = cfg.dp_world_size;
  const int replica_ranks = groups.model_size() * groups.pipe_size();  // ranks that train one replica's tokens

  // 2. Data and tokenizer; the model's vocabulary follows the tokenizer's. Rank 0 builds the cache under out_dir
  // (tokenizer, token shard) while the others wait, then they read it.
  TrainDataRequest data_req{o.data, o.tokenizer, o.vocab_size, (fs::path(o.out_dir) / "data").string()};
  if (pg && rank != 0) pg->barrier()->wait();
  TrainData data = prepare_train_data(data_req, quiet ? nullptr : &log);
  if (pg && rank == 0) pg->barrier()->wait();
  if (!resume_tag.empty()) check_resume_tokenizer(ckpt_dir, resume_tag, data);
  if (o.init_from.empty()) {
    mcfg.vocab_size = data.tokenizer.vocab_size();
  } else {
    DSCPP_CHECK(data.tokenizer.vocab_size() <= mcfg.vocab_size, "--init-from ", o.init_from, ": the tokenizer has ",
                data.tokenizer.vocab_size(), " tokens but the model's vocabulary is ", mcfg.vocab_size,
                " (pass the model's own tokenizer with --tokenizer)");
  }
  mcfg.validate();  // again: the vocabulary is the tokenizer's now
  const int64_t B = cfg.train_micro_batch_size_per_gpu, gas = cfg.gradient_accumulation_steps;

  DataLoaderConfig dc;
  dc.shards = data.shards;
  dc.batch_size = B;
  dc.seq_len = T;
  dc.seed = cfg.seed;
  // Validation: the last 2% of sequences, more (up to 10%) when that is less than one batch; smaller batches when
  // even 10% is (a small corpus at a long context).
  int64_t total_tokens = 0;
  for (const auto& sh : data.shards) total_tokens += TokenShard(sh).size();
  const int64_t n_seq = total_tokens > T ? (total_tokens - 1) / T : 0;
  dc.val_fraction = n_seq ? std::min(0.1, std::max(0.02, (double(B) + 0.5) / double(n_seq))) : 0.02;
  const int64_t val_B = std::max<int64_t>(1, std::min<int64_t>(B, int64_t(double(n_seq) * dc.val_fraction)));
  // Each data-parallel rank takes its block of every global batch (tensor and pipeline peers: the same block).
  split_by_data_axis(dc, groups);
  DataLoader train(dc);
  dc.rank = 0;     // every rank evaluates the same validation batches (only rank 0 prints them)
  dc.world_size = 1;
  dc.validation = true;
  dc.shuffle = false;
  dc.batch_size = val_B;
  DataLoader val(dc);

  // 3. Model and engine.
  ModelOptions mopts;
  // One GPU per local rank (init_process_group made the same choice for NCCL).
  mopts.device = o.device == "cuda" ? Device::cuda(env.local_rank % std::max(1, cuda_device_count())) : Device::cpu();
  mopts.dtype = model_dtype(cfg);
  const bool zero_sharded = cfg.zero_optimization.stage > 0 && dp > 1;
  if (zero_sharded) mopts.pad_multiple = 16 * dp;  // every unit splits evenly (Note [ZeRO units])
  mopts.allocate_grads = !(zero_sharded && cfg.zero_optimization.stage >= 2);  // stage 2/3: per-unit windows
  // ZeRO-3 initialises each rank's shard only (zero.Init), in host memory with offload_param (even in one process:
  // the model need not fit the device); importing a Hugging Face model needs the whole model.
  const auto& op = cfg.zero_optimization.offload_param;
  const bool sharded_init = (zero_sharded || (op && op->enabled())) && cfg.zero_optimization.stage == 3 &&
                            o.init_from.empty();
  mopts.materialize_params = !sharded_init;
  mopts.tp_group = groups.model;  // Note [Tensor parallelism]: this rank's shard of the model
  mopts.sequence_parallel = cfg.dscpp.sequence_parallel;
  auto model = make_train_model(mcfg, cfg, groups, mopts);
  // --timing-init: a step's time does not depend on the weights' values, but the model's init draws them one by one
  // on the host (Note [Autotuning trial cost], cli/cmd_autotune.cpp); the device fills its buffer at once.
  if (!sharded_init && o.timing_init) fill_normal(model->params().flat_params(), cfg.seed, 0, 0.0f, 0.02f);
  else if (!sharded_init) model->init_weights(cfg.seed);
  if (!o.init_from.empty()) {
    // Every name, shape and dtype checked before the model changes; a pipeline stage and a tensor-parallel rank read
    // only their own parameters (the last stage the tied table's copy too), each rank its slices.
    load_hf_model(o.init_from, *model);
    if (!o.quiet && rank == 0) log << "initialised from " << o.init_from << std::endl;
  }
  if (o.activation_checkpointing && !cfg.activation_checkpointing.number_checkpoints)
    model->set_checkpoint_policy(CheckpointPolicy(size_t(mcfg.n_layer), true));
  EngineOptions eopts;
  eopts.dp_group = groups.data;
  eopts.model_parallel_group = groups.model_parallel;
  if (sharded_init) eopts.init_seed = cfg.seed;
  eopts.same_on_every_rank = flags;
  if (!quiet) eopts.log = &log;  // the engine reports its model-state bytes at start-up
  // Note [Pipeline engine]: a pipeline rank's Engine steps its stage; the PipelineEngine runs each batch through it.
  std::unique_ptr<PipelineEngine> pipe;
  std::unique_ptr<Engine> whole;
  if (groups.pipe)
    pipe = initialize_pipeline(std::move(model), cfg, eopts, {groups.pipe, int(cfg.dscpp.pipeline.virtual_stages)});
  else
    whole = initialize(std::move(model), cfg, eopts);
  Engine* engine = pipe ? &pipe->engine() : whole.get();
  if (!o.trace.empty()) engine->set_trace_file(o.trace);
  Model& m = engine->model();

  if (o.overwrite && rank == 0 && !o.resume) {
    const std::vector<std::string> old_tags = list_tags(ckpt_dir);
    if (!old_tags.empty() && !quiet)
      log << "--overwrite: deleting the " << old_tags.size() << " checkpoint tag(s) in " << ckpt_dir << std::endl;
    remove_all_checkpoints(ckpt_dir);
  }
  if (!resume_tag.empty()) {
    nlohmann::json cs = engine->load_checkpoint(ckpt_dir, resume_tag);
    const auto& dl = cs.at("dataloader");
    train.set_state({dl.at("epoch").get<uint64_t>(), dl.at("position").get<uint64_t>(), dl.at("seed").get<uint64_t>()});
    if (!quiet) log << "resumed from " << ckpt_dir << "/" << resume_tag << " at step " << engine->global_steps() << std::endl;
    // Note [Resuming under another global batch] (data/dataloader.cpp): the data goes on from the saved sequence.
    const int64_t saved_batch = dl.value("train_batch_size", int64_t(0));
    if (!quiet && saved_batch && saved_batch != cfg.train_batch_size)
      log << "note: the checkpoint trained with train_batch_size " << saved_batch << ", this run with "
          << cfg.train_batch_size << " (train_micro_batch_size_per_gpu " << B << " x gradient_accumulation_steps "
          << gas << " x " << dp << " data-parallel ranks): the data goes on from sequence " << train.state().position
          << " of epoch " << train.state().epoch << ", " << cfg.train_batch_size << " per step. To keep "
          << saved_batch << ", "
          << (saved_batch % (B * dp) == 0
                  ? "set gradient_accumulation_steps to " + std::to_string(saved_batch / (B * dp))
                  : "choose train_micro_batch_size_per_gpu x gradient_accumulation_steps x the data-parallel "
                    "ranks = " + std::to_string(saved_batch))
          << std::endl;
  }
  auto save = [&] {
    if (o.no_save) return;
    DataLoaderState s = train.state();
    nlohmann::json cs = {{"dataloader", {{"epoch", s.epoch}, {"position", s.position}, {"seed", s.seed},
                                         {"train_batch_size", cfg.train_batch_size}}}};
    engine->save_checkpoint(ckpt_dir, "", cs, o.keep_last, data.tokenizer_path, "tokenizer.json");
    if (!quiet)
      log << "checkpoint global_step" << engine->global_steps() << ": training stalled "
          << std::fixed << std::setprecision(2) << engine->last_save_stall_seconds() << std::defaultfloat << " s"
          << (engine->config().checkpoint.async_save ? " (snapshot; written in the background)" : "") << std::endl;
  };

  const double flops_per_token = mcfg.train_flops_per_token(T);
  if (!quiet) {
    log << "model " << mcfg.arch << ": " << mcfg.n_layer << " layers, " << mcfg.n_head << " heads ("
        << mcfg.n_kv_head << " kv), width " << mcfg.n_embd << ", vocab " << mcfg.vocab_size << ", context " << T
        << ", " << mcfg.num_parameters() << " parameters";
    if (replica_ranks > 1) log << " (" << m.params().num_parameters() << " on this rank)";
    log << std::endl;
    log << "data: " << train.total_tokens() << " tokens, " << train.batches_per_epoch() << " steps per epoch at "
        << B << " x " << T << " x " << gas << " (micro-batch x seq x grad accumulation); validation "
        << val.num_sequences() << " sequences" << std::endl;
    log << "optimizer " << engine->optimizer().name() << ", schedule "
        << (cfg.scheduler.type.empty() ? "constant" : cfg.scheduler.type) << ", clipping " << cfg.gradient_clipping
        << ", steps " << o.steps << std::endl;
    if (pg)
      log << "data parallel: " << dp << " ranks (" << pg->backend() << "), global batch " << cfg.train_batch_size
          << ", ZeRO stage " << cfg.zero_optimization.stage << ", reduce_bucket_size "
          << cfg.zero_optimization.reduce_bucket_size << ", overlap_comm "
          << (cfg.zero_optimization.overlap_comm ? "on" : "off") << std::endl;
    if (replica_ranks > 1) log << "model parallel: " << groups.topo.str() << " (pipe x data x model)" << std::endl;
    if (pipe) {
      const int64_t p = groups.pipe_size(), v = cfg.dscpp.pipeline.virtual_stages;
      char bubble[32];  // Megatron's interleaved bubble: (p - 1) / (v m + p - 1) of the step
      std::snprintf(bubble, sizeof bubble, "%.1f%%", 100.0 * double(p - 1) / double(v * gas + p - 1));
      log << "pipeline: " << p << " stages" << (v > 1 ? " x " + std::to_string(v) + " virtual" : std::string())
          << ", partition " << cfg.pipeline.partition << ", " << gas << " micro-batches per step, bubble " << bubble
          << " in theory" << std::endl;
    }
  }
  // Note [ZeRO buffer estimate]: what this run's step should peak at, told before it starts, and set beside the
  // measured peak at the end.
  TrainingMemoryInputs mem = training_memory_inputs(mcfg, cfg, T, mopts.device.is_cuda());
  mem.workload.checkpoint = m.checkpoint_policy();  // --activation-checkpointing and the pipeline's interval too
  const TrainingMemoryEstimate predicted = estimate_training_memory(mcfg, mem.workload, mem.setup);
  // Under tp / pp a rank holds its stage's slices and the activations its schedule keeps (Note [Pipeline memory
  // estimate]), as dscpp estimate-memory --tp --pp prints them; the stages differ, so the highest is told too.
  std::vector<StageMemory> stages;
  if (replica_ranks > 1) stages = estimate_pipeline_memory(mcfg, pipeline_layout(cfg), mem.workload, mem.setup);
  int64_t highest = stages.empty() ? predicted.peak_bytes : 0;
  for (const StageMemory& sm : stages) highest = std::max(highest, sm.peak_bytes());
  const StageMemory* own = stages.empty() ? nullptr : &stages[size_t(groups.stage)];
  const int64_t predicted_peak = own ? own->peak_bytes() : predicted.peak_bytes;
  const int64_t predicted_host = own ? 0 : predicted.peak.cpu;
  if (!quiet) {
    if (!own) {
      log << "memory per rank, predicted: peak " << fmt_bytes(predicted.peak_bytes) << " = model states "
          << fmt_bytes(predicted.states.total()) << " + activations and ZeRO buffers "
          << fmt_bytes(predicted.peak_bytes - predicted.states.total()) << ", in " << predicted.peak_at;
      if (predicted.peak.cpu > 0) log << "; host memory " << fmt_bytes(predicted.peak.cpu);  // Note [Memory tiers]
    } else {
      log << "memory per rank, predicted (tp " << cfg.tp_size() << " x pp " << cfg.pp_size() << ", stage "
          << groups.stage << "): peak " << fmt_bytes(own->peak_bytes()) << " = model states "
          << fmt_bytes(own->states.total()) << " + activations and pipeline buffers "
          << fmt_bytes(own->activation_peak) << ", in " << own->peak_at;
      if (stages.size() > 1) log << "; the highest stage " << fmt_bytes(highest);
    }
    if (mopts.device.is_cuda())
      log << ", of the GPU's " << fmt_bytes(cuda_device_memory(mopts.device.index));
    log << std::endl;
    if (mopts.sequence_parallel && cfg.tp_size() > 1)
      log << "sequence parallelism: the residual stream split by rows over the " << cfg.tp_size() << " tensor-parallel "
          << "ranks (dscpp.sequence_parallel; the prediction above does not model it: an upper bound)" << std::endl;
    if (mopts.device.is_cuda() && highest > cuda_device_memory(mopts.device.index))
      log << "warning: the predicted peak does not fit this GPU: expect out of memory. Lower "
             "train_micro_batch_size_per_gpu, raise zero_optimization.stage, or set "
             "activation_checkpointing.number_checkpoints (dscpp estimate-memory compares the options)" << std::endl;
  }
  const bool trial = cfg.autotuning.enabled;  // an autotuning trial: it ends at end_profile_step, no evaluation
  if (!trial) {
    res.first_val_loss = evaluate(*engine, pipe.get(), val, o.eval_batches, val_B, T);
    if (!quiet) log << "step " << engine->global_steps() << " | val loss " << res.first_val_loss << std::endl;
  }

  Allocator& device_alloc = allocator_for(mopts.device);
  device_alloc.reset_peak();
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  const int64_t start_step = engine->global_steps();
  const int64_t print_every = cfg.steps_per_print > 0 ? cfg.steps_per_print : 0;
  double train_seconds = 0, window_seconds = 0;
  int64_t window_tokens = 0;
  auto run_start = Clock::now();
  inject_train_fault(o.fault);
  while (engine->global_steps() < o.steps && !engine->autotuning_finished()) {
    auto t0 = Clock::now();
    if (pipe) {  // every rank reads the batch; the first stage takes the tokens, the last the targets
      PipelineEngine::MicroBatches mbs;
      for (int64_t micro = 0; micro < gas; micro++) {
        Tensor px = Tensor::empty({B, T}, DType::i32), py = Tensor::empty({B, T}, DType::i32);
        train.next_batch(px, py);
        mbs.push_back({px, py});
      }
      res.losses.push_back(pipe->train_batch(mbs));  // the replicas' mean already
    } else {
      for (int64_t micro = 0; micro < gas; micro++) {
        train.next_batch(x, y);
        engine->forward(x, y);
        engine->backward();
        engine->step();
      }
      res.losses.push_back(engine->last_loss());
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    train_seconds += dt;
    window_seconds += dt;
    window_tokens += B * T * gas;
    const int64_t step = engine->global_steps();
    if (!o.quiet && print_every && (step % print_every == 0 || step == o.steps)) {
      // Collectives at print steps (the same steps on every rank): the loss averaged, tokens/s summed over ranks.
      const float loss = pipe ? res.losses.back() : engine->global_last_loss();
      double tps = window_tokens / window_seconds;
      if (pg) tps = all_reduce_values(*pg, {float(tps)}, ReduceOp::sum, mopts.device)[0] / replica_ranks;
      double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      double eta = train_seconds / double(step - start_step) * double(o.steps - step);
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.2f GFLOP/s | elapsed %s"
                    " | ETA %s",
                    (long long)step, (long long)o.steps, loss, engine->get_lr(),
                    engine->last_grad_norm(), tps, tps * flops_per_token / 1e9, fmt_duration(elapsed).c_str(),
                    fmt_duration(eta).c_str());
      if (!quiet) log << line << std::endl;
      if (cfg.wall_clock_breakdown && !quiet) {
        StepTimes st = engine->take_step_times();
        std::snprintf(line, sizeof line, "  time per optimizer step: forward %.1f ms | backward %.1f ms | step %.1f ms",
                      st.forward_ms / double(st.steps), st.backward_ms / double(st.steps), st.step_ms / double(st.steps));
        log << line;
        if (st.offload_step_ms > 0) {  // Note [Optimizer offload]: the host step runs beside the next forward
          std::snprintf(line, sizeof line, " | host optimizer %.1f ms, waited for %.1f ms",
                        st.offload_step_ms / double(st.steps), st.offload_wait_ms / double(st.steps));
          log << line;
        }
        log << std::endl;
      }
      window_seconds = 0;
      window_tokens = 0;
    }
    if (o.eval_every && step % o.eval_every == 0 && step != o.steps) {
      float vl = evaluate(*engine, pipe.get(), val, o.eval_batches, val_B, T);  // the parameters brought up to date
      if (!quiet) log << "step " << step << " | val loss " << vl << std::endl;
    }
    if (o.save_every && step % o.save_every == 0 && step != o.steps) save();
  }
  int64_t steps_run = engine->global_steps() - start_step;
  res.tokens_per_second = steps_run ? double(steps_run * B * T * gas) / train_seconds : 0.0;
  if (pg)
    res.tokens_per_second =
        all_reduce_values(*pg, {float(res.tokens_per_second)}, ReduceOp::sum, mopts.device)[0] / replica_ranks;
  res.peak_tensor_bytes = device_alloc.stats().peak_bytes;
  res.predicted_peak_bytes = predicted_peak;
  res.peak_rss_bytes = peak_rss_bytes();
  res.global_steps = engine->global_steps();
  if (engine->autotuning_finished()) {  // Note [Autotuning metrics]: the trial ends here
    if (!quiet)
      log << "autotuning: steps " << cfg.autotuning.start_profile_step << ".." << cfg.autotuning.end_profile_step
          << " timed, metrics written to " << cfg.autotuning.metric_path.value_or("stdout")
          << "; the trial ends here (peak tensor memory " << fmt_bytes(res.peak_tensor_bytes) << ", predicted "
          << fmt_bytes(predicted_peak) << ")" << std::endl;
    if (pg) pg->barrier()->wait();
    return res;
  }
  res.final_val_loss = evaluate(*engine, pipe.get(), val, o.eval_batches, val_B, T);
  save();
  engine->wait_for_checkpoint();  // an asynchronous save must be committed before we report it
  if (!quiet) {
    log << "step " << res.global_steps << " | val loss " << res.final_val_loss << " (was " << res.first_val_loss
        << ")" << std::endl;
    log << "trained " << steps_run << " steps in " << fmt_duration(train_seconds) << ": " << long(res.tokens_per_second)
        << " tokens/s; peak tensor memory " << fmt_bytes(res.peak_tensor_bytes) << " (predicted "
        << fmt_bytes(predicted_peak + (mopts.device.is_cpu() ? predicted_host : 0))  // one allocator
        << "), peak RSS "
        << fmt_bytes(res.peak_rss_bytes) << std::endl;
    const AttentionCalls att = attention_calls();
    if (att.cudnn_forward + att.own_forward > 0)  // CUDA attention ran: say which implementation
      log << "attention: " << (att.cudnn_forward ? "cuDNN fused" : "own kernels") << " (" << att.cudnn_forward
          << " cuDNN / " << att.own_forward << " own forward calls; dscpp.attention is \"" << cfg.dscpp.attention
          << "\": auto, cudnn or own)" << std::endl;
    if (!o.no_save) log << "checkpoint: " << ckpt_dir << "/" << read_latest_tag(ckpt_dir) << std::endl;
  }

  // 4. Samples. Under ZeRO-3 every forward gathers parameters (a collective), so every rank generates the same
  // samples in step (same seeds) and rank 0 prints them. A pipeline stage cannot generate alone.
  const char* prompts[] = {"The ", "A man", "Q:", "Life is", "I think"};
  const bool all_ranks_generate = engine->zero_params() != nullptr || groups.model != nullptr;  // collectives
  if (pipe && o.num_samples > 0 && !quiet)
    log << "samples: none under pipeline parallelism (generating needs the whole model on one rank)" << std::endl;
  for (int i = 0; !pipe && (rank == 0 || all_ranks_generate) && i < o.num_samples; i++) {
    std::string prompt = prompts[i % 5];
    std::vector<int32_t> ids = data.tokenizer.encode(prompt);
    ids.insert(ids.begin(), data.tokenizer.bos_id());
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.seed = cfg.seed + uint64_t(i);
    std::vector<int32_t> out = generate(m, ids, o.sample_tokens, sp, data.tokenizer.eot_id());
    std::vector<int32_t> text_ids(out.begin() + 1, out.end());
    if (!text_ids.empty() && text_ids.back() == data.tokenizer.eot_id()) text_ids.pop_back();
    res.samples.push_back(data.tokenizer.decode(text_ids));
    if (!quiet && rank == 0) log << "--- sample " << i + 1 << " ---\n" << res.samples.back() << std::endl;
  }
  // Every rank is done with every exchange before any tears its groups down: a rank whose last collective returned
  // first could otherwise close connections a slower peer still reads from (as torch.distributed advises a barrier
  // before destroy_process_group).
  if (pg) pg->barrier()->wait();
  return res;
}

}  // namespace dscpp
