#include "dscpp/kernels/attention_backend.h"

#include <atomic>
#include <cstdlib>

#include "attention_calls.h"
#include "dscpp/core/check.h"

namespace dscpp {

namespace {
std::atomic<int> g_backend{-1};  // -1: not yet read from DSCPP_ATTENTION
}  // namespace

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

AttentionBackend attention_backend() {
  int b = g_backend.load(std::memory_order_relaxed);
  if (b < 0) {
    const char* env = std::getenv("DSCPP_ATTENTION");
    b = int(env && *env ? parse_attention_backend(env) : AttentionBackend::automatic);
    g_backend.store(b, std::memory_order_relaxed);
  }
  return AttentionBackend(b);
}

void set_attention_backend(AttentionBackend b) { g_backend.store(int(b), std::memory_order_relaxed); }

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
