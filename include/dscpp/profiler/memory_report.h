// Memory report: current and peak bytes per device and per MemoryCategory, from each allocator's stats().
#pragma once
#include <string>
#include <vector>

#include "dscpp/core/allocator.h"

namespace dscpp {

struct DeviceMemory {
  Device device;
  MemoryStats stats;
};

// The CPU allocator, then every CUDA device (when built with CUDA and a device is present).
std::vector<DeviceMemory> collect_memory_stats();
// A table: one row per device and category with current and peak, then the device totals and reserved bytes.
std::string format_memory_report(const std::vector<DeviceMemory>& devices);
std::string format_bytes(int64_t bytes);  // "1.50 GiB", "512 B"

}  // namespace dscpp
