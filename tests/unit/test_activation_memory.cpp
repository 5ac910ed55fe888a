// Note [Activation estimate]: the replay of the model's allocations gives the CPU allocator's peak over a real
// forward + backward byte for byte (GPT-2 and Llama, tied and untied heads, several shapes, with and without
// activation checkpointing); the CUDA variant agrees with the peaks measured on an H200 (docs/PERF.md).
#include <gtest/gtest.h>

#include "dscpp/core/allocator.h"
#include "dscpp/core/rng.h"
#include "dscpp/models/activation_memory.h"
#include "tiny_models.h"

using namespace dscpp;
using dscpp::test_fixtures::tiny_model_config;

namespace {

int64_t measured_peak(const ModelConfig& cfg, int64_t B, int64_t T, const CheckpointPolicy& ckpt, int64_t fused_rows,
                      bool cpu_ckpt) {
  auto m = make_model(cfg, ModelOptions{});
  m->init_weights(7);
  m->set_checkpoint_policy(ckpt);
  m->set_cpu_checkpointing(cpu_ckpt);
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  Rng rng(RngState{99, 0, 4});
  for (int64_t i = 0; i < B * T; i++) {
    x.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(cfg.vocab_size));
    y.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(cfg.vocab_size));
  }
  Allocator& a = cpu_allocator();
  const int64_t base = a.stats().current_bytes;
  a.reset_peak();
  {
    if (fused_rows) m->fuse_head_into_next_forward(1.0f, fused_rows);
    Loss loss = m->forward(x, y);
    m->backward(1.0f);
    EXPECT_TRUE(std::isfinite(loss.value()));
  }
  return a.stats().peak_bytes - base;
}

}  // namespace

TEST(ActivationMemory, ReplayMatchesTheCpuAllocator) {
  struct Case {
    const char* arch;
    bool tied;
    int64_t n_layer, B, T;
    int checkpoints;     // number_checkpoints
    int64_t fused_rows;  // Note [Fused head]: tokens per chunk, 0 = not fused
    bool cpu = false;    // Note [CPU checkpointing]
  };
  const Case cases[] = {{"gpt2", true, 3, 2, 16, 0, 0},   {"gpt2", true, 3, 3, 8, 3, 0},   {"gpt2", true, 4, 1, 16, 2, 0},
                        {"llama", true, 3, 2, 16, 0, 0},  {"llama", false, 3, 4, 5, 0, 0}, {"llama", false, 4, 2, 16, 4, 0},
                        {"llama", true, 5, 2, 12, 2, 0},  {"gpt2", true, 3, 2, 16, 0, 5},  {"llama", false, 3, 4, 5, 3, 7},
                        {"llama", true, 2, 2, 16, 0, 32},  {"gpt2", true, 3, 3, 8, 3, 0, true},
                        {"llama", false, 5, 2, 16, 2, 0, true}, {"llama", true, 4, 4, 5, 4, 7, true}};
  for (const Case& c : cases) {
    ModelConfig cfg = tiny_model_config(c.arch);
    cfg.n_layer = c.n_layer;
    cfg.tie_embeddings = c.tied;
    const CheckpointPolicy ckpt = checkpoint_every(cfg.n_layer, c.checkpoints);
    ActivationWorkload w;
    w.micro_batch = c.B;
    w.seq_len = c.T;
    w.act = DType::f32;
    w.checkpoint = ckpt;
    w.cuda = false;
    w.fused_head = c.fused_rows > 0;
    w.fused_head_rows = c.fused_rows;
    w.cpu_checkpointing = c.cpu;
    const ActivationEstimate e = estimate_activation_memory(cfg, w);
    const std::string what = std::string(c.arch) + (c.tied ? " tied" : " untied") + " L=" +
                             std::to_string(c.n_layer) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                             " checkpoints=" + std::to_string(c.checkpoints) + " fused rows " +
                             std::to_string(c.fused_rows) + (c.cpu ? " cpu_checkpointing" : "") + " (peak at " +
                             e.peak_at + ")";
    EXPECT_EQ(e.peak_bytes, measured_peak(cfg, c.B, c.T, ckpt, c.fused_rows, c.cpu)) << what;
    EXPECT_GT(e.peak_bytes, e.end_of_forward) << what << ": backward adds to what forward kept";
  }
}

TEST(ActivationMemory, CheckpointingAndShapesMoveThePeak) {
  ModelConfig cfg = tiny_model_config("llama");
  cfg.n_layer = 8;
  ActivationWorkload w;
  w.micro_batch = 4;
  w.seq_len = 16;
  const ActivationEstimate plain = estimate_activation_memory(cfg, w);
  w.checkpoint = checkpoint_every(cfg.n_layer, cfg.n_layer);
  const ActivationEstimate every = estimate_activation_memory(cfg, w);
  EXPECT_LT(every.peak_bytes, plain.peak_bytes / 2) << "recomputing every block keeps only the residual stream";
  EXPECT_NE(every.peak_at.find("(recomputed)"), std::string::npos) << every.peak_at;
  // A vocabulary far wider than the MLP puts the peak at the lm head's backward, where the logits meet dxf.
  w.checkpoint.clear();
  cfg.vocab_size = 50000;
  EXPECT_EQ(estimate_activation_memory(cfg, w).peak_at, "backward: the loss and the lm head");
  // Twice the tokens, twice the bytes (up to the 512-byte rounding of each block).
  cfg = tiny_model_config("gpt2");
  w.micro_batch = 64;
  w.seq_len = 256;
  const double one = double(estimate_activation_memory(cfg, w).peak_bytes);
  w.micro_batch = 128;
  EXPECT_NEAR(double(estimate_activation_memory(cfg, w).peak_bytes) / one, 2.0, 0.01);
  EXPECT_THROW(estimate_activation_memory(cfg, ActivationWorkload{0, 16, DType::bf16, {}, true}), Error);
  w.checkpoint = {true};
  EXPECT_THROW(estimate_activation_memory(cfg, w), Error) << "one flag for two blocks";
}

// Note [CPU checkpointing]: on a GPU the checkpointed inputs leave the device; a long sequence with every block
// checkpointed keeps about three [N, C] inputs there instead of L + 1, and the host holds L of them.
TEST(ActivationMemory, CpuCheckpointingMovesTheInputsToTheHost) {
  const ModelConfig cfg = ModelConfig::preset("llama-1b");
  ActivationWorkload w;
  w.micro_batch = 1;
  w.seq_len = 32768;
  w.checkpoint = checkpoint_every(cfg.n_layer, cfg.n_layer);
  w.fused_head = true;
  const ActivationEstimate on_device = estimate_activation_memory(cfg, w);
  w.cpu_checkpointing = true;
  const ActivationEstimate on_host = estimate_activation_memory(cfg, w);
  const int64_t NC = w.seq_len * cfg.n_embd * 2, L = cfg.n_layer;
  EXPECT_EQ(on_device.host_bytes, 0);
  EXPECT_EQ(on_host.host_bytes, L * NC);
  EXPECT_EQ(on_device.end_of_forward - on_host.end_of_forward, L * NC) << "x_0..x_{L-1} left, x_L stays";
  EXPECT_GT(on_device.peak_bytes - on_host.peak_bytes, (L - 3) * NC) << on_host.peak_at;
  w.cuda = false;  // the CPU device: the copies are in the same memory, so forward ends holding as much
  ActivationWorkload kept = w;
  kept.cpu_checkpointing = false;
  EXPECT_EQ(estimate_activation_memory(cfg, w).end_of_forward, estimate_activation_memory(cfg, kept).end_of_forward);
}

// Note [Fused head]: at a wide vocabulary the logits dominate what forward keeps; fusing keeps a chunk of them.
TEST(ActivationMemory, FusedHeadKeepsAChunkOfTheLogits) {
  const ModelConfig cfg = ModelConfig::preset("llama-1b");
  ActivationWorkload w;
  w.micro_batch = 16;
  w.seq_len = 1024;
  const ActivationEstimate plain = estimate_activation_memory(cfg, w);
  w.fused_head = true;
  const ActivationEstimate fused = estimate_activation_memory(cfg, w);
  const int64_t N = 16 * 1024, logits = N * cfg.vocab_size * 2;
  const int64_t chunk = fused_head_rows(N, cfg.vocab_size, 2) * cfg.vocab_size * 2;
  EXPECT_EQ(chunk, int64_t(4194) * 32000 * 2) << "about 256 MiB of logits";
  // Forward keeps dxf [N, C] instead of xf [N, C], the loss's log-sum-exp and the logits.
  EXPECT_EQ(plain.end_of_forward - fused.end_of_forward, logits + N * 4) << plain.end_of_forward;
  EXPECT_LE(fused.peak_bytes, plain.peak_bytes) << fused.peak_at;
  // Llama 3.2 1B's shape (vocab 128256, tied): the logits were most of the peak, which now falls in a block.
  ModelConfig l3 = cfg;
  l3.vocab_size = 128256;
  w.fused_head = false;
  const ActivationEstimate l3_plain = estimate_activation_memory(l3, w);
  w.fused_head = true;
  const ActivationEstimate l3_fused = estimate_activation_memory(l3, w);
  EXPECT_EQ(l3_plain.peak_at, "backward: the loss and the lm head");
  EXPECT_NE(l3_fused.peak_at.find("block"), std::string::npos) << l3_fused.peak_at;
  EXPECT_GT(l3_plain.peak_bytes - l3_fused.peak_bytes, N * l3.vocab_size * 2 * 3 / 4) << "most of the logits saved";
}

// What the H200 measured (docs/PERF.md, eighth session): the one-GPU stage-0 peak minus the model states, bf16,
// T = 1024: Llama-1B at micro-batch 16, 17.70 GiB; GPT-2 350M at 32, 24.32 GiB. The replay leaves out the kernels'
// asynchronous workspaces and the first step's GEMM autotuning, so it may be a little under, never over.
TEST(ActivationMemory, CudaReplayAgreesWithTheH200) {
  struct Case {
    const char* preset;
    int64_t B;
    double measured_gib;
  };
  for (const Case& c : {Case{"llama-1b", 16, 17.70}, Case{"gpt2-medium", 32, 24.32}}) {
    ActivationWorkload w;
    w.micro_batch = c.B;
    w.seq_len = 1024;
    const double gib = double(estimate_activation_memory(ModelConfig::preset(c.preset), w).peak_bytes) / (1 << 30);
    EXPECT_LE(gib, c.measured_gib * 1.005) << c.preset;
    EXPECT_GE(gib, c.measured_gib * 0.98) << c.preset;
  }
}
