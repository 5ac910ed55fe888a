// Note [Frozen weights] (frozen_weights.h): a per-thread flag, so that a training thread never sees it.
#include "dscpp/kernels/frozen_weights.h"

namespace dscpp::ops {
namespace {
thread_local bool frozen = false;
}

FrozenWeights::FrozenWeights() : previous_(frozen) { frozen = true; }
FrozenWeights::~FrozenWeights() { frozen = previous_; }
bool weights_frozen() { return frozen; }

}  // namespace dscpp::ops
