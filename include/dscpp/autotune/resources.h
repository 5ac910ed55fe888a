// ResourceManager (DeepSpeed's autotuning/scheduler.py: Node, Reservation, resource_request): the slots trials run
// on, GPUs of the hostfile's nodes (or of this machine), or process slots on the CPU, and their reservation per
// trial. A trial takes `slots_per_node` slots on each of `nodes` hosts; trials whose slots do not overlap run at
// once.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dscpp/launcher/resources.h"

namespace dscpp::autotune {

using Reservation = launcher::Resources;  // the hosts and slots one trial holds

class ResourceManager {
 public:
  // Throws dscpp::Error when no trial fits the pool (fewer hosts, or fewer slots on each, than a trial takes).
  ResourceManager(launcher::Resources pool, int nodes, int slots_per_node);
  std::optional<Reservation> reserve();  // the first hosts with enough idle slots, their lowest slots; or none now
  void release(const Reservation& r);
  int capacity() const;                  // trials that can run at once
  int ranks_per_trial() const { return nodes_ * slots_per_node_; }
  const launcher::Resources& pool() const { return pool_; }

 private:
  launcher::Resources pool_, idle_;
  int nodes_, slots_per_node_;
};

}  // namespace dscpp::autotune
