// Note [Pipeline memory estimate] and Note [Activations under TP and PP]: what a rank of a tp x pp layout keeps per
// micro-batch, against sizes written out by hand from Megatron's split; the micro-batches each stage holds under
// 1F1B and interleaved 1F1B; the bubble; and the replay under tensor parallelism against the CPU allocator's peak
// on two forked Gloo ranks.
#include <gtest/gtest.h>

#include <algorithm>

#include "dist/equivalence.h"
#include "dscpp/core/allocator.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/pipe_engine.h"
#include "tiny_models.h"

using namespace dscpp;
using dscpp::test_fixtures::tiny_model_config;

namespace {

ModelConfig llama4() {  // C 32, 4 heads of 8, 2 KV heads, SwiGLU 80 wide, vocabulary 97
  ModelConfig c = tiny_model_config("llama");
  c.n_layer = 4;
  return c;
}

ActivationWorkload f32_cpu(int64_t B, int64_t T) {
  ActivationWorkload w;
  w.micro_batch = B, w.seq_len = T, w.act = DType::f32, w.cuda = false;
  return w;
}

TrainingMemorySetup adamw_zero(int stage) {
  TrainingMemorySetup s;
  s.stage = stage, s.fp32_master = false, s.optimizer_states = 2;
  return s;
}

}  // namespace

TEST(PipelineMemory, HeldPerMicroBatchUnderTensorParallelism) {
  // B 2 x T 8: N = 16 tokens, f32. Per block under tp 2 (2 heads, 1 KV group, 40 MLP columns per rank): the block's
  // output, its norm1 output x1 and both norms' rstd whole; q/k/v (2 + 2 x 1 heads of 8), the attention output
  // (2 heads of 8), its log-sum-exp (B x 2 heads x T) and the MLP's gate|up (80) and activation (40) split.
  const int64_t N = 16, C = 32;
  const int64_t block = N * C * 4 + N * 4 + N * C * 4 + N * 32 * 4 + N * 16 * 4 + 2 * 2 * 8 * 4 + N * 4 + N * 80 * 4 +
                        N * 40 * 4;
  ASSERT_EQ(block, 15104);
  PipelineLayout lay;
  lay.tp = 2, lay.pp = 2, lay.micro_batches = 4, lay.partition_method = "uniform";
  const auto stages = estimate_pipeline_memory(llama4(), lay, f32_cpu(2, 8), adamw_zero(0));
  ASSERT_EQ(stages.size(), 2u);
  // Stage 0: the embeddings' output and blocks 0-1, plus the 4-byte loss; stage 1: the received hidden state,
  // blocks 2-3, the final norm's output and rstd, this rank's 49 of the 97 (padded to 98) logits, the loss's lse.
  EXPECT_EQ(stages[0].micro_batch_bytes, N * C * 4 + 2 * block + 4);
  EXPECT_EQ(stages[1].micro_batch_bytes, N * C * 4 + 2 * block + N * C * 4 + N * 49 * 4 + N * 4 + N * 4 + 4);
  // 1F1B: stage s holds min(p - s, m) micro-batches.
  EXPECT_EQ(stages[0].in_flight, 2);
  EXPECT_EQ(stages[1].in_flight, 1);
  // Stage 0's peak: micro-batch 1 stashed while micro-batch 0's backward runs.
  ActivationWorkload w = f32_cpu(2, 8);
  w.tp = 2, w.first_item = 0, w.end_item = 3;
  const ActivationEstimate e0 = estimate_activation_memory(llama4(), w);
  // (Its returned 4-byte loss is dropped by the engine after forward; the replay's backward counts one.)
  EXPECT_EQ(stages[0].activation_peak, stages[0].micro_batch_bytes - 4 + e0.backward_peak) << stages[0].peak_at;
  EXPECT_EQ(stages[0].peak_at, "backward of micro-batch 0, chunk 0");
  // Model states: each rank's own parameters, 16 bytes each (f32 params, grads, AdamW's two states).
  EXPECT_EQ(stages[1].states.total(), 16 * stages[1].params);
}

TEST(PipelineMemory, InFlightUnderEachSchedule) {
  ModelConfig c = llama4();
  c.n_layer = 6;
  struct Case {
    int pp, v;
    int64_t m;
    std::vector<int> want;
  };
  // 1F1B: min(p - s, m); interleaved: (p - s - 1) * 2 + (v - 1) * p + 1 chunks' worth, at most v m.
  for (const Case& k : {Case{2, 1, 4, {2, 1}}, Case{4, 1, 8, {4, 3, 2, 1}}, Case{4, 1, 2, {2, 2, 2, 1}},
                        Case{2, 2, 4, {5, 3}}, Case{2, 2, 2, {4, 3}}}) {
    PipelineLayout lay;
    lay.pp = k.pp, lay.virtual_stages = k.v, lay.micro_batches = k.m, lay.partition_method = "uniform";
    const auto stages = estimate_pipeline_memory(c, lay, f32_cpu(1, 4), adamw_zero(0));
    for (size_t s = 0; s < stages.size(); s++)
      EXPECT_EQ(stages[s].in_flight, k.want[s]) << "pp " << k.pp << " v " << k.v << " m " << k.m << " stage " << s;
  }
}

TEST(PipelineMemory, OneStageIsTheOneProcessReplay) {
  // pp 1: micro-batches one after another, the peak the single-process replay's whatever their count.
  for (int64_t m : {1, 3})
    for (int ckpt : {0, 2}) {
      PipelineLayout lay;
      lay.micro_batches = m;
      ActivationWorkload w = f32_cpu(2, 8);
      w.checkpoint = checkpoint_every(4, ckpt);
      const auto stages = estimate_pipeline_memory(llama4(), lay, w, adamw_zero(0));
      ASSERT_EQ(stages.size(), 1u);
      EXPECT_EQ(stages[0].activation_peak, estimate_activation_memory(llama4(), w).peak_bytes) << m << " " << ckpt;
      EXPECT_EQ(stages[0].in_flight, 1);
    }
}

TEST(PipelineMemory, CheckpointingKeepsOnlyTheBlockInputs) {
  PipelineLayout lay;
  lay.pp = 2, lay.micro_batches = 4, lay.partition_method = "uniform";
  ActivationWorkload w = f32_cpu(2, 8);
  w.checkpoint = checkpoint_every(4, 4);
  const auto stages = estimate_pipeline_memory(llama4(), lay, w, adamw_zero(0));
  // Stage 0 keeps the embeddings' output and each block's output, [N, C] each, and the loss.
  EXPECT_EQ(stages[0].micro_batch_bytes, 3 * 16 * 32 * 4 + 4);
}

TEST(PipelineMemory, Bubble) {
  EXPECT_DOUBLE_EQ(pipeline_bubble(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 8, 2), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(1, 8), 0.0);
}

// Note [Activations under TP and PP]: the replay with w.tp = 2 is tensor-parallel rank 0's allocator peak over a
// forward and backward of the whole model, with and without partition_activations; rank 1 (no residual temporary on
// the CPU) stays under it. Exact, run after run: Gloo's worker drops the tensors an op captured before the op
// completes (Note [Gloo comm thread]); before it did, either rank measured an [N, C] tensor or more at random.
TEST(PipelineMemory, TensorParallelReplayMatchesTheCpuAllocator) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (const char* arch : {"gpt2", "llama"})
    for (int ckpt : {0, 1, 3})
      for (int variant = 0; variant < 3; variant++) {  // plain, partition_activations, sequence parallelism
        const bool partition = variant == 1, sp = variant == 2;
        if (partition && !ckpt) continue;
        test::expect_all_pass(test::run_ranks(2, [&](int rank, int port) {
          auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(30));
          ModelConfig cfg = tiny_model_config(arch);
          cfg.n_layer = 3;
          ModelOptions mo;
          mo.tp_group = pg.get();
          mo.sequence_parallel = sp;
          auto m = make_model(cfg, mo);
          m->init_weights(7);
          ActivationWorkload w = f32_cpu(3, 16);
          w.tp = 2;
          w.checkpoint = checkpoint_every(cfg.n_layer, ckpt);
          m->set_checkpoint_policy(w.checkpoint);
          w.partition_activations = partition;
          w.sequence_parallel = sp;
          m->set_partition_activations(partition);
          Tensor x = Tensor::empty({3, 16}, DType::i32), y = Tensor::empty({3, 16}, DType::i32);
          for (int64_t i = 0; i < x.numel(); i++) {
            x.data<int32_t>()[i] = int32_t((i * 37 + 5) % cfg.vocab_size);
            y.data<int32_t>()[i] = int32_t((i * 11 + 3) % cfg.vocab_size);
          }
          Allocator& a = cpu_allocator();
          const int64_t base = a.stats().current_bytes;
          a.reset_peak();
          {
            Loss loss = m->forward(x, y);
            m->backward(1.0f);
            EXPECT_TRUE(std::isfinite(loss.value()));
          }
          const int64_t measured = a.stats().peak_bytes - base;
          const ActivationEstimate e = estimate_activation_memory(cfg, w);
          const std::string what = std::string(arch) + " checkpoints " + std::to_string(ckpt) +
                                   (partition ? " partition_activations" : "") + (sp ? " sequence_parallel" : "") +
                                   " rank " +
                                   std::to_string(rank) + " (peak at " + e.peak_at + ")";
          if (rank == 0) {
            EXPECT_EQ(measured, e.peak_bytes) << what;
          }
          EXPECT_LE(measured, e.peak_bytes) << what;
          ActivationWorkload whole = w;
          whole.tp = 1;
          EXPECT_LT(e.peak_bytes, estimate_activation_memory(cfg, whole).peak_bytes) << what;
          if (sp) {  // what a block keeps of the residual stream is this rank's half of the rows
            ActivationWorkload whole_rows = w;
            whole_rows.sequence_parallel = false;
            EXPECT_LT(e.end_of_forward, estimate_activation_memory(cfg, whole_rows).end_of_forward) << what;
          }
          ActivationWorkload unpartitioned = w;
          unpartitioned.partition_activations = false;
          if (partition) {  // each checkpointed input held as its rows: (N - ceil(N / 2)) x C x 4 bytes less
            EXPECT_EQ(estimate_activation_memory(cfg, unpartitioned).end_of_forward - e.end_of_forward,
                      std::count(w.checkpoint.begin(), w.checkpoint.end(), true) * (48 - 24) * cfg.n_embd * 4)
                << what;
          }
          test::leave_together(*pg);
        }, std::chrono::seconds(60)));
      }
}

// Note [Pipeline memory estimate]: PP 2 under 1F1B and interleaved (2 chunks per stage) on two forked Gloo ranks, 4
// micro-batches (stage 0 holds two at once, interleaved five chunks' worth): the CPU allocator's peak over a
// train_batch (the second: the optimizer's states exist) above what the first left is each stage's estimated
// activation peak above what a batch leaves, exactly. Interleaved, stage 0 sends a d(input) after its next backward
// (Note [Pipeline memory estimate]), which a margin of one [N, C] tensor once hid.
TEST(PipelineMemory, PipelineEstimateMatchesTheCpuAllocator) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (const char* arch : {"gpt2", "llama"})
    for (int ckpt : {0, 4})
      for (int v : {1, 2}) {
        test::expect_all_pass(test::run_ranks(2, [&](int rank, int port) {
          auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(30));
          ModelConfig cfg = tiny_model_config(arch);
          cfg.n_layer = 4;
          cfg.tie_embeddings = std::string(arch) == "gpt2";  // GPT-2's tied table: a copy on each stage
          const int64_t B = 4, T = 16, m = 4;
          std::string json = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.001}})";
          if (ckpt) json += R"(, "activation_checkpointing": {"number_checkpoints": )" + std::to_string(ckpt) + "}";
          json += "}";
          auto model = make_pipeline_stage(cfg, pipe_stage_layers(cfg, "uniform", 2, v, rank));
          model->init_weights(7);
          auto pe = initialize_pipeline(std::move(model), DeepSpeedConfig::from_string(json, 1), EngineOptions{},
                                        {pg.get(), v});
          PipelineEngine::MicroBatches mbs;
          for (int64_t j = 0; j < m; j++) {
            Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
            for (int64_t i = 0; i < x.numel(); i++) {
              x.data<int32_t>()[i] = int32_t((i * 37 + 5 * j + 1) % cfg.vocab_size);
              y.data<int32_t>()[i] = int32_t((i * 11 + 3 * j + 2) % cfg.vocab_size);
            }
            mbs.push_back({x, y});
          }
          pe->train_batch(mbs);
          Allocator& a = cpu_allocator();
          const int64_t base = a.stats().current_bytes;
          a.reset_peak();
          pe->train_batch(mbs);
          const int64_t measured = a.stats().peak_bytes - base;
          PipelineLayout lay;
          lay.pp = 2, lay.virtual_stages = v, lay.micro_batches = m, lay.partition_method = "uniform";
          ActivationWorkload w = f32_cpu(B, T);
          w.checkpoint = checkpoint_every(cfg.n_layer, ckpt);
          const StageMemory est = estimate_pipeline_memory(cfg, lay, w, adamw_zero(0))[size_t(rank)];
          const std::string what = std::string(arch) + " checkpoints " + std::to_string(ckpt) + " chunks " +
                                   std::to_string(v) + " stage " + std::to_string(rank) + " (peak at " +
                                   est.peak_at + ", " +
                                   std::to_string(est.in_flight) + " in flight)";
          EXPECT_GE(measured, est.activation_peak - est.between_batches) << what;
          EXPECT_LE(measured, est.activation_peak - est.between_batches) << what;
          test::leave_together(*pg);
        }, std::chrono::seconds(60)));
      }
}
