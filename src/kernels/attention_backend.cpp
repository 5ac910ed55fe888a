#include "dscpp/kernels/attention_backend.h"

#include "attention_calls.h"
#include "dscpp/core/check.h"

namespace dscpp {

AttentionCallCounters& attention_call_counters() {
  static AttentionCallCounters c;
  return c;
}

AttentionBackend parse_attention_backend(const std::string& name) {
  if (name == "auto" || name == "automatic") return AttentionBackend::automatic;
  if (name == "cudnn") return AttentionBackend::cudnn;
  if (name == "own") return AttentionBackend::own;
  throw Error("attention backend '" + name + "': expected auto, cudnn or own");
}

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::automatic: return "auto";
    case AttentionBackend::cudnn: return "cudnn";
    case AttentionBackend::own: return "own";
  }
  return "?";
}

bool cudnn_attention_built() {
#ifdef DSCPP_WITH_CUDNN_ATTENTION
  return true;
#else
  return false;
#endif
}

AttentionCalls attention_calls() {
  const AttentionCallCounters& c = attention_call_counters();
  return AttentionCalls{c.cudnn_forward.load(), c.cudnn_backward.load(), c.own_forward.load(), c.own_backward.load()};
}

}  // namespace dscpp
