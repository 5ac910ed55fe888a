// PeerAllReduce (comm/peer_all_reduce.h) on 2 GPUs, and on 4 and 8 when present (one process per GPU; skipped
// otherwise): against the f32 sum in rank order rounded once to the dtype, which it must give bit for bit on every
// rank (one-shot and two-shot), for sizes from one 16-byte vector to the buffer's capacity, in bf16, f16 and f32;
// back to back calls of changing sizes (buffer reuse across epochs, Note [Peer all-reduce]); calls captured in a
// CUDA graph and replayed; equal to NCCL's all-reduce on 2 ranks; and create's refusals (a CPU group; a rank count
// the kernels do not take) on every rank alike. The parent never touches CUDA (a context does not survive fork).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dist/equivalence.h"
#include "dist/multiprocess.h"
#include "dscpp/comm/peer_all_reduce.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/cuda_graph.h"

using namespace dscpp;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
constexpr int64_t kMaxBytes = 1 << 20;

// Rank r's input: values that make every rounding visible (not small integers), distinct per rank and element.
Tensor input(int rank, int64_t n, DType dt, uint64_t salt) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; i++)
    t.data<float>()[i] = float(std::sin(double(i * 7 + 13 * rank + 1) + double(salt)) * (1.0 + rank));
  return t.to(dt);  // rounded to the dtype, as the device holds it
}

// The sum in rank order, in f32, rounded once to dt (what the kernel computes); f32 host values.
Tensor reference(int world, int64_t n, DType dt, uint64_t salt) {
  Tensor acc = Tensor::zeros({n}, DType::f32);
  for (int r = 0; r < world; r++) {
    const Tensor x = input(r, n, dt, salt).to(DType::f32);
    for (int64_t i = 0; i < n; i++) acc.data<float>()[i] += x.data<float>()[i];
  }
  return acc.to(dt).to(DType::f32);
}

void expect_bits(const Tensor& got_device, const Tensor& want, const std::string& what) {
  const Tensor got = got_device.to(Device::cpu()).to(DType::f32);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); i++)
    if (got.data<float>()[i] != want.data<float>()[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.numel() << " elements differ, the first at " << first
                    << " (got " << (first >= 0 ? got.data<float>()[first] : 0.0f) << ", want "
                    << (first >= 0 ? want.data<float>()[first] : 0.0f) << ")";
}

void check_world(int world) {
  expect_all_pass(run_ranks(
      world,
      [&](int rank, int port) {
        cuda_set_device(rank);
        auto pg = new_process_group("nccl", rank, world, "127.0.0.1", port, kTimeout);
        std::string why;
        auto ar = PeerAllReduce::create(*pg, kMaxBytes, &why);
        ASSERT_TRUE(ar) << why;
        const Device dev = Device::cuda(rank);
        uint64_t salt = 0;
        for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
          const int64_t per_vec = 16 / int64_t(dtype_size(dt)), max_n = kMaxBytes / int64_t(dtype_size(dt));
          // One vector, odd vector counts, a decode step's [1, 4096], the one-/two-shot boundary, capacity.
          for (int64_t n : {per_vec, 3 * per_vec, 4096 * per_vec / 8, int64_t(4096), (int64_t(256) << 10) /
                                int64_t(dtype_size(dt)), max_n - per_vec * world, max_n}) {
            Tensor x = input(rank, n, dt, ++salt).to(dev);
            ASSERT_TRUE(ar->fits(x)) << n;
            ar->all_reduce(x);
            expect_bits(x, reference(world, n, dt, salt), std::string(dtype_name(dt)) + " n " + std::to_string(n));
          }
        }
        // Back to back, sizes changing every call, nothing waited for between them: 40 epochs of buffer reuse.
        std::vector<Tensor> xs;
        std::vector<uint64_t> salts;
        for (int k = 0; k < 40; k++) {
          const int64_t n = 8 * (1 + (k * 37) % 3000);
          salts.push_back(++salt);
          xs.push_back(input(rank, n, DType::bf16, salt).to(dev));
          ar->all_reduce(xs.back());
        }
        for (int k = 0; k < 40; k++)
          expect_bits(xs[size_t(k)], reference(world, xs[size_t(k)].numel(), DType::bf16, salts[size_t(k)]),
                      "back-to-back call " + std::to_string(k));
        // Captured in a graph: three calls, replayed twice over fresh inputs.
        Tensor a = Tensor::empty({4096}, DType::bf16, dev), b = Tensor::empty({24576}, DType::bf16, dev);
        CudaGraph g;
        g.capture(rank, [&] {
          ar->all_reduce(a);
          ar->all_reduce(b);
          ar->all_reduce(a);
        });
        for (int replay = 0; replay < 2; replay++) {
          const uint64_t sa = ++salt, sb = ++salt;
          a.copy_from(input(rank, 4096, DType::bf16, sa));
          b.copy_from(input(rank, 24576, DType::bf16, sb));
          g.replay();
          // a is summed twice: the sum of world copies of the first sum.
          Tensor once = reference(world, 4096, DType::bf16, sa), twice = Tensor::empty({4096}, DType::f32);
          for (int64_t i = 0; i < 4096; i++) twice.data<float>()[i] = float(world) * once.data<float>()[i];
          expect_bits(a, twice.to(DType::bf16).to(DType::f32), "graph replay a");
          expect_bits(b, reference(world, 24576, DType::bf16, sb), "graph replay b");
        }
        if (world == 2) {  // NCCL's sum of two is one rounding of a + b too
          Tensor x = input(rank, 65536, DType::bf16, ++salt).to(dev), y = x.clone();
          ar->all_reduce(x);
          pg->all_reduce(y)->wait();
          expect_bits(x, y.to(Device::cpu()).to(DType::f32), "against NCCL");
        }
        test::leave_together(*pg);
      },
      std::chrono::seconds(300)));
}

class PeerAllReduceGpus : public ::testing::TestWithParam<int> {};

TEST_P(PeerAllReduceGpus, SumsBitForBitOnEveryRank) {
  const int world = GetParam();
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (test::gpus_without_touching_cuda_here() < world) GTEST_SKIP() << "needs " << world << " GPUs";
  check_world(world);
}

INSTANTIATE_TEST_SUITE_P(Worlds, PeerAllReduceGpus, ::testing::Values(2, 4, 8));

TEST(PeerAllReduce, RefusedOnEveryRankWhereItCannotRun) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    std::string why;
    EXPECT_FALSE(PeerAllReduce::create(*pg, kMaxBytes, &why));
    EXPECT_FALSE(why.empty());
    // Neither rank may close its pairs while the other still connects (a flake under ctest -j: rank 0's connect
    // met "Connection closed by peer" once rank 1 had refused and exited).
    pg->barrier()->wait();
    test::leave_together(*pg);
  }));
}

}  // namespace
