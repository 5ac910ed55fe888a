// Philox tensor fills: the CPU path draws from Rng in element order (the definition); CUDA tensors use the device
// kernels in src/core/cuda/random.cu, which compute the same element from its block index.
#include "dscpp/core/random_fill.h"

#include "dscpp/core/rng.h"
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/tensor_cuda.h"
#endif

namespace dscpp {
namespace {

void check_float(const Tensor& t, const char* what) {
  DSCPP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16, what, " of ",
              t.str(), ": f32, bf16 or f16 expected");
}

Rng rng_at(uint64_t seed, uint64_t offset) {
  RngState s;
  s.seed = seed;
  s.offset = offset;
  s.used = 4;
  return Rng(s);
}

}  // namespace

void fill_uniform(const Tensor& t, uint64_t seed, uint64_t offset, float lo, float hi) {
  check_float(t, "fill_uniform");
#ifdef DSCPP_WITH_CUDA
  if (t.device().is_cuda()) return cuda::tensor_random(t, cuda::RandomKind::uniform, seed, offset, lo, hi);
#endif
  DSCPP_CHECK(t.device().is_cpu(), "fill_uniform on ", t.device().str(), " needs the CUDA backend");
  Rng r = rng_at(seed, offset);
  Tensor out = t;
  float range = hi - lo;
  for (int64_t i = 0; i < t.numel(); i++) store_from_float(out, i, lo + range * r.uniform());
}

void fill_normal(const Tensor& t, uint64_t seed, uint64_t offset, float mean, float std) {
  check_float(t, "fill_normal");
#ifdef DSCPP_WITH_CUDA
  if (t.device().is_cuda()) return cuda::tensor_random(t, cuda::RandomKind::normal, seed, offset, mean, std);
#endif
  DSCPP_CHECK(t.device().is_cpu(), "fill_normal on ", t.device().str(), " needs the CUDA backend");
  Rng r = rng_at(seed, offset);
  Tensor out = t;
  for (int64_t i = 0; i < t.numel(); i++) store_from_float(out, i, mean + std * r.normal());
}

void fill_random_bits(const Tensor& t, uint64_t seed, uint64_t offset) {
  DSCPP_CHECK(t.dtype() == DType::i32, "fill_random_bits of ", t.str(), ": i32 expected");
#ifdef DSCPP_WITH_CUDA
  if (t.device().is_cuda()) return cuda::tensor_random(t, cuda::RandomKind::bits, seed, offset, 0, 0);
#endif
  DSCPP_CHECK(t.device().is_cpu(), "fill_random_bits on ", t.device().str(), " needs the CUDA backend");
  Rng r = rng_at(seed, offset);
  int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = int32_t(r.next_u32());
}

}  // namespace dscpp
