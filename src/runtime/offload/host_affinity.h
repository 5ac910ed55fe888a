// Where the optimizer offload's host step runs (Note [Host step affinity]). Private to the runtime.
//
// Note [Host step affinity]
// On a host of several NUMA nodes (most GPU servers: two sockets), a GPU hangs off one node's PCIe root. The host
// step streams the masters and optimizer states (12 bytes and more per parameter) through the CPUs' memory
// controllers and copies gradients and parameters over that GPU's PCIe link, so it is fastest on the GPU's own node:
// its threads on that node's CPUs, its buffers in that node's memory. With dscpp.offload.numa_affinity (default on)
// the host step's OpenMP threads are pinned one per CPU to the CPUs of the device's node that the process may use
// (a launcher's or numactl's binding narrows them), and the host buffers are allocated by the constructing thread
// while it is bound to the same CPUs, so first touch places their pages there. The node comes from sysfs
// (/sys/bus/pci/devices/<PCI id>/numa_node, <node>/cpulist); where it is unknown (a CPU device, one node, no sysfs
// entry, -1), every allowed CPU serves and nothing is pinned. The default thread count becomes the chosen CPUs less
// one (the training thread's), as dscpp.offload.threads says.
#pragma once
#include <sched.h>

#include <string>
#include <vector>

#include "dscpp/core/dtype.h"

namespace dscpp {

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; throws on anything else.
std::vector<int> parse_cpu_list(const std::string& list);

// The NUMA node of a CUDA device's PCI function under `sysfs` (e.g. "/sys"), or -1 when unknown.
int device_numa_node(Device d, const std::string& sysfs = "/sys");
// The CPUs of NUMA node `node` under `sysfs`; empty when unknown.
std::vector<int> numa_node_cpus(int node, const std::string& sysfs = "/sys");
// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

struct HostStepCpus {
  std::vector<int> cpus;  // where the host step's threads run
  int node = -1;          // the device's NUMA node they belong to; -1: not pinned (every allowed CPU)
};
// The device's node's CPUs that the process may use; with numa false, or nothing of the node allowed, every allowed
// CPU and node -1.
HostStepCpus host_step_cpus(Device d, bool numa, const std::string& sysfs = "/sys");

// Binds the calling thread to `cpus` for its lifetime and restores its mask after (a no-op for an empty set).
class ScopedCpuBinding {
 public:
  explicit ScopedCpuBinding(const std::vector<int>& cpus);
  ~ScopedCpuBinding();
  ScopedCpuBinding(const ScopedCpuBinding&) = delete;
  ScopedCpuBinding& operator=(const ScopedCpuBinding&) = delete;

 private:
  cpu_set_t old_;
  bool bound_ = false;
};

// Pins the calling thread's OpenMP team of `threads` threads, thread i to cpus[i % cpus.size()]; returns the CPU each
// thread runs on afterwards (sched_getcpu), for checks.
std::vector<int> pin_openmp_team(const std::vector<int>& cpus, int threads);

}  // namespace dscpp
