// CRC32 as zlib computes it (IEEE 802.3, reflected, init/xorout 0xffffffff), so `zlib.crc32(open(f,'rb').read())`
// in Python reproduces a manifest entry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dscpp {

uint32_t crc32_update(uint32_t crc, const void* data, size_t n);  // start from crc = 0
// Streams the whole file; also returns its size in *bytes when given. Throws CheckpointError (missing_file / io).
uint32_t file_crc32(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace dscpp
