// Numbers as the commands print them.
#pragma once
#include <cstdint>
#include <string>

namespace dscpp::cli {

// 124439808 -> "124,439,808"
inline std::string grouped(int64_t v) {
  const std::string s = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (i > 0 && s[i - 1] != '-' && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace dscpp::cli
