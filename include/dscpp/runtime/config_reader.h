// SectionReader: reads one JSON object of a config with type and range checks, remembers which keys it consumed,
// and reports the rest (finish()). The DeepSpeed training config (src/runtime/config/) and the inference engine's
// config (inference/inference_config.h) both read their sections with it, so their errors read alike.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/runtime/config.h"

namespace dscpp::config_detail {

using json = nlohmann::json;

size_t edit_distance(const std::string& a, const std::string& b);
// " (did you mean 'x'?)" for the closest candidate within a small distance, else "".
std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates);
std::string value_str(const json& v);  // compact JSON text of a value, for messages
[[noreturn]] void fail(const std::string& path, const json& value, const std::string& rule);

class SectionReader {
 public:
  // `j` must be an object (else ConfigError at `path`). `drop_auto`: a value "auto" counts as absent.
  SectionReader(const json& j, std::string path, bool drop_auto = true);

  // Each reader marks the key as known and leaves `out` untouched when the key is absent (or "auto").
  // They return whether a value was read.
  bool get(const char* key, bool& out);
  bool get(const char* key, int64_t& out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
  bool get(const char* key, double& out, double lo, double hi, bool lo_open = false, bool hi_open = false);
  bool get(const char* key, std::string& out, const std::vector<std::string>& choices = {});
  bool get(const char* key, std::optional<int64_t>& out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
  bool get(const char* key, std::optional<double>& out, double lo, double hi);
  bool get(const char* key, std::optional<std::string>& out);
  bool get(const char* key, std::optional<bool>& out);
  const json* raw(const char* key);       // the value (nullptr if absent or "auto"); marks the key known
  void known(const char* key) { known_.insert(key); }
  bool has(const char* key) const;        // present and not "auto" (does not mark)
  std::string path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& section() const { return path_; }

  // Throws ConfigError for the first key no reader asked for, with a did-you-mean among the known keys.
  void finish() const;

 private:
  const json& j_;
  std::string path_;
  bool drop_auto_;
  std::set<std::string> known_;
};

}  // namespace dscpp::config_detail
