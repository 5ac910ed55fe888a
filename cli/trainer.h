// The training driver behind `dscpp train`: prepares data (the built-in corpus, text files or token shards),
// builds the model and the engine from a DeepSpeed config, runs the loop with progress lines and ETA, evaluates,
// checkpoints (resumable: data-loader position and RNG included) and prints samples. Started by `dscpp launch` (or
// torchrun, mpirun, srun) with WORLD_SIZE > 1 it trains data-parallel: gloo (--device cpu) or nccl (cuda) group,
// the loader sharded by rank, rank 0 prints, writes the data cache and the checkpoints.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "dscpp/models/model.h"

namespace dscpp {

struct TrainOptions {
  std::string config_path;            // DeepSpeed JSON config; "" = the built-in default (train_default_config: bf16 on cuda)
  std::string model = "gpt2-tiny";    // a preset name, or a path to a Hugging Face config.json
  std::string init_from;              // a Hugging Face model folder (config.json + safetensors) to fine-tune
  std::vector<std::string> data;      // *.bin token shards or text files; empty = the built-in corpus
  std::string tokenizer;              // tokenizer.json, or vocab.json (merges.txt beside it); "" = train one
  int vocab_size = 2048;              // when training a tokenizer
  std::string out_dir = "runs/default";
  int64_t steps = 800;                // optimizer steps (about 3 minutes of the default run on 2 cores)
  int64_t seq_len = 0;                // 0 = the model's context length
  int64_t save_every = 0;             // 0 = save at the end only
  std::string fault;                  // tests only: "crash", "hang" or "oom" at the first step (DSCPP_TRAIN_FAULT)
  bool no_save = false;               // write no checkpoint (a measurement run)
  bool timing_init = false;           // weights from the device's random stream, not the model's init (timing runs)
  int keep_last = 2;                  // checkpoint tags to keep
  bool resume = false;                // continue from out_dir/checkpoints/latest (else its newest complete tag)
  bool overwrite = false;             // a new run into an out_dir holding checkpoints: delete them first
  bool activation_checkpointing = false;  // recompute every block (number_checkpoints in the config picks fewer)
  int64_t eval_every = 100;           // 0 = only at the end
  int64_t eval_batches = 8;
  int num_samples = 3;
  int64_t sample_tokens = 80;
  uint64_t seed = 0;                  // 0 = the config's seed
  bool quiet = false;                 // no progress lines (tests)
  std::string device = "cpu";         // "cpu" or "cuda" (bf16/fp16 from the config need cuda)
  int tp = 0;                          // tensor-parallel degree; 0 = the config's (tensor_parallel.autotp_size)
  int pp = 0;                          // pipeline stages; 0 = the config's (pipeline.stages)
  bool sequence_parallel = false;      // sets dscpp.sequence_parallel (Note [Sequence parallelism])
  std::string trace;                  // Chrome trace of the flops_profiler.profile_step step ("" = none)
};

struct TrainResult {
  std::vector<float> losses;          // mean loss of each optimizer step run in this call (this rank's micro-batches)
  float first_val_loss = 0, final_val_loss = 0;
  double tokens_per_second = 0;       // over the steps run, excluding evaluation and checkpointing; summed over ranks
  int64_t peak_tensor_bytes = 0;      // allocator high-water mark
  int64_t predicted_peak_bytes = 0;   // the estimate before the first step: this rank's stage under tp / pp
  int64_t peak_rss_bytes = 0;         // process high-water mark (getrusage)
  int64_t global_steps = 0;
  std::string checkpoint_dir;
  std::vector<std::string> samples;
};

// The built-in DeepSpeed config for `dscpp train` with no --config (AdamW, WarmupCosineLR over `steps`, clipping).
std::string train_default_config(int64_t steps, const std::string& device);

// The model --init-from, --model (a preset or a config.json) names; its vocabulary is the tokenizer's once the data
// is prepared (unless --init-from).
ModelConfig train_model_config(const TrainOptions& opts);

TrainResult run_training(const TrainOptions& opts, std::ostream& log);

}  // namespace dscpp
