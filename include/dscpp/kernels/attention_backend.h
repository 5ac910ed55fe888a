// Which implementation runs attention_forward / attention_backward on CUDA tensors.
//
//   automatic  cuDNN's fused flash attention (Hopper kernels) where it is built in and supports the call
//              (bf16/f16, head dim a multiple of 8 up to 128, 16-byte aligned buffers) and T is a multiple of 64
//              (cuDNN builds a graph per shape: generation's every-length calls stay on our kernels), else ours
//   cudnn      cuDNN wherever it supports the call, any T ("dscpp train" reports which one ran)
//   own        always our kernels (src/kernels/cuda/attention.cu)
//
// The caller passes the choice to each op call: a model carries it in its KernelPolicy (models/model.h), which the
// engine sets from the config key dscpp.attention and the tools without a config from --attention. The contract
// (ops.h) is the same for every backend, including the saved lse, so a forward from one may feed a backward from
// the other. CPU tensors always use the CPU reference.
#pragma once
#include <cstdint>
#include <string>

namespace dscpp {

enum class AttentionBackend { automatic, cudnn, own };

AttentionBackend parse_attention_backend(const std::string& name);  // "auto"|"cudnn"|"own"; throws naming the value
const char* attention_backend_name(AttentionBackend b);

bool cudnn_attention_built();  // compiled with cuDNN's frontend (a CUDA build that found cudnn_frontend.h)

// Calls served by cuDNN since start-up (forward and backward counted separately), for tests and reports.
struct AttentionCalls {
  int64_t cudnn_forward = 0, cudnn_backward = 0, own_forward = 0, own_backward = 0;
};
AttentionCalls attention_calls();

}  // namespace dscpp
