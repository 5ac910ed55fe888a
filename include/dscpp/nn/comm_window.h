// Communication windows (Note [Communication windows]): points in backward where a collective launched now would run
// beside kernels that share the GPU well (the attention core, the embedding scatter) instead of beside persistent
// GEMMs. Layers call comm_window() there; a data-parallel reducer that defers its buckets to these points installs
// the hook for the duration of a backward with CommWindowHook. Without a hook comm_window() does nothing.
#pragma once
#include <functional>

namespace dscpp {

void comm_window();

class CommWindowHook {
 public:
  explicit CommWindowHook(std::function<void()> fn);  // an empty fn installs nothing
  ~CommWindowHook();
  CommWindowHook(const CommWindowHook&) = delete;
  CommWindowHook& operator=(const CommWindowHook&) = delete;

 private:
  std::function<void()> prev_;
};

}  // namespace dscpp
