// Memory report from allocator statistics.
#include "dscpp/profiler/memory_report.h"

#include <cstdio>

#include "dscpp/core/cuda.h"

namespace dscpp {

std::vector<DeviceMemory> collect_memory_stats() {
  std::vector<DeviceMemory> out;
  out.push_back({Device::cpu(), cpu_allocator().stats()});
  for (int d = 0; d < cuda_device_count(); d++) out.push_back({Device::cuda(d), allocator_for(Device::cuda(d)).stats()});
  return out;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", (long long)(bytes < 0 ? -bytes : bytes));
  else std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

std::string format_memory_report(const std::vector<DeviceMemory>& devices) {
  std::string s;
  char line[160];
  std::snprintf(line, sizeof line, "%-8s %-14s %14s %14s\n", "device", "category", "current", "peak");
  s += line;
  for (const DeviceMemory& d : devices) {
    const std::string dev = d.device.str();
    for (size_t c = 0; c < size_t(MemoryCategory::count); c++) {
      if (d.stats.category_current[c] == 0 && d.stats.category_peak[c] == 0) continue;
      std::snprintf(line, sizeof line, "%-8s %-14s %14s %14s\n", dev.c_str(), memory_category_name(MemoryCategory(c)),
                    format_bytes(d.stats.category_current[c]).c_str(), format_bytes(d.stats.category_peak[c]).c_str());
      s += line;
    }
    std::snprintf(line, sizeof line, "%-8s %-14s %14s %14s   reserved %s, %lld allocations\n", dev.c_str(), "total",
                  format_bytes(d.stats.current_bytes).c_str(), format_bytes(d.stats.peak_bytes).c_str(),
                  format_bytes(d.stats.reserved_bytes).c_str(), (long long)d.stats.num_allocs);
    s += line;
  }
  return s;
}

}  // namespace dscpp
