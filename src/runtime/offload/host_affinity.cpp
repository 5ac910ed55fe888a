// Note [Host step affinity] (host_affinity.h).
#include "runtime/offload/host_affinity.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"


namespace dscpp {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

bool set_affinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part.erase(std::remove_if(part.begin(), part.end(), [](unsigned char c) { return std::isspace(c); }),
               part.end());
    if (part.empty()) continue;
    const size_t dash = part.find('-');
    auto number = [&](const std::string& x) {
      DSCPP_CHECK(!x.empty() && std::all_of(x.begin(), x.end(), [](unsigned char c) { return std::isdigit(c); }),
                  "CPU list '", list, "': '", x, "' is not a CPU number");
      return std::stoi(x);
    };
    const int lo = number(part.substr(0, dash)), hi = dash == std::string::npos ? lo : number(part.substr(dash + 1));
    DSCPP_CHECK(lo <= hi, "CPU list '", list, "': range ", lo, "-", hi, " runs backwards");
    for (int c = lo; c <= hi; c++) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int device_numa_node(Device d, const std::string& sysfs) {
  const std::string id = d.is_cuda() ? cuda_device_pci_id(d.index) : "";
  if (id.empty()) return -1;
  const std::string node = read_line(sysfs + "/bus/pci/devices/" + id + "/numa_node");
  try {
    return node.empty() ? -1 : std::max(-1, std::stoi(node));
  } catch (const std::exception&) {
    return -1;
  }
}

std::vector<int> numa_node_cpus(int node, const std::string& sysfs) {
  if (node < 0) return {};
  const std::string list = read_line(sysfs + "/devices/system/node/node" + std::to_string(node) + "/cpulist");
  return list.empty() ? std::vector<int>{} : parse_cpu_list(list);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

HostStepCpus host_step_cpus(Device d, bool numa, const std::string& sysfs) {
  HostStepCpus h;
  h.cpus = allowed_cpus();
  if (!numa) return h;
  const int node = device_numa_node(d, sysfs);
  const std::vector<int> mine = numa_node_cpus(node, sysfs);
  std::vector<int> both;
  std::set_intersection(mine.begin(), mine.end(), h.cpus.begin(), h.cpus.end(), std::back_inserter(both));
  if (both.empty()) return h;
  h.cpus = std::move(both);
  h.node = node;
  return h;
}

ScopedCpuBinding::ScopedCpuBinding(const std::vector<int>& cpus) {
  if (cpus.empty() || sched_getaffinity(0, sizeof old_, &old_) != 0) return;
  bound_ = set_affinity(cpus);
}

ScopedCpuBinding::~ScopedCpuBinding() {
  if (bound_) sched_setaffinity(0, sizeof old_, &old_);
}

std::vector<int> pin_openmp_team(const std::vector<int>& cpus, int threads) {
  std::vector<int> on(size_t(std::max(threads, 0)), -1);
  if (cpus.empty() || threads < 1) return on;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    set_affinity({cpus[size_t(t) % cpus.size()]});
    if (t < threads) on[size_t(t)] = sched_getcpu();
  }
  return on;
}

}  // namespace dscpp
