// Typed, range-checked reads of one config section, and the did-you-mean helper.
#include "runtime/config/config_reader.h"

#include <algorithm>
#include <cmath>

namespace dscpp::config_detail {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Levenshtein distance, one row at a time.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  // Accept a candidate within a third of the key's length (at least 2 edits): catches typos, not unrelated words.
  size_t best = SIZE_MAX;
  std::string best_name;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best) best = d, best_name = c;
  }
  size_t limit = std::max<size_t>(2, key.size() / 3);
  if (best_name.empty() || best > limit) return "";
  return " (did you mean '" + best_name + "'?)";
}

std::string value_str(const json& v) { return v.dump(); }

void fail(const std::string& path, const json& value, const std::string& rule) {
  throw ConfigError(path, "DeepSpeed config: " + path + " = " + value_str(value) + ": " + rule);
}

SectionReader::SectionReader(const json& j, std::string path, bool drop_auto)
    : j_(j), path_(std::move(path)), drop_auto_(drop_auto) {
  if (!j_.is_object()) fail(path_, j_, "expected a JSON object");
}

bool SectionReader::has(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end()) return false;
  return !(drop_auto_ && it->is_string() && it->get<std::string>() == "auto");
}

const json* SectionReader::raw(const char* key) {
  known_.insert(key);
  if (!has(key)) return nullptr;
  return &j_.at(key);
}

bool SectionReader::get(const char* key, bool& out) {
  const json* v = raw(key);
  if (!v) return false;
  if (!v->is_boolean()) fail(path(key), *v, "expected true or false");
  out = v->get<bool>();
  return true;
}

bool SectionReader::get(const char* key, int64_t& out, int64_t lo, int64_t hi) {
  const json* v = raw(key);
  if (!v) return false;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) fail(path(key), *v, "too large");
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // DeepSpeed writes sizes as 5e8; accept a float that holds an exact integer (as pydantic's lax mode does).
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.2e18) fail(path(key), *v, "expected an integer");
    x = int64_t(d);
  } else {
    fail(path(key), *v, "expected an integer");
  }
  if (x < lo) fail(path(key), *v, "must be >= " + std::to_string(lo));
  if (x > hi) fail(path(key), *v, "must be <= " + std::to_string(hi));
  out = x;
  return true;
}

static std::string num(double x) { return json(x).dump(); }

bool SectionReader::get(const char* key, double& out, double lo, double hi, bool lo_open, bool hi_open) {
  const json* v = raw(key);
  if (!v) return false;
  if (!v->is_number()) fail(path(key), *v, "expected a number");
  double x = v->get<double>();
  if (!std::isfinite(x)) fail(path(key), *v, "must be finite");
  if (lo_open ? !(x > lo) : !(x >= lo)) fail(path(key), *v, std::string("must be ") + (lo_open ? "> " : ">= ") + num(lo));
  if (hi_open ? !(x < hi) : !(x <= hi)) fail(path(key), *v, std::string("must be ") + (hi_open ? "< " : "<= ") + num(hi));
  out = x;
  return true;
}

bool SectionReader::get(const char* key, std::string& out, const std::vector<std::string>& choices) {
  const json* v = raw(key);
  if (!v) return false;
  if (!v->is_string()) fail(path(key), *v, "expected a string");
  std::string s = v->get<std::string>();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "'" : ", '") + c + "'";
    fail(path(key), *v, "must be one of " + list + did_you_mean(s, choices));
  }
  out = s;
  return true;
}

bool SectionReader::get(const char* key, std::optional<int64_t>& out, int64_t lo, int64_t hi) {
  const json* v = raw(key);
  if (!v || v->is_null()) return false;
  int64_t x = 0;
  get(key, x, lo, hi);
  out = x;
  return true;
}

bool SectionReader::get(const char* key, std::optional<double>& out, double lo, double hi) {
  const json* v = raw(key);
  if (!v || v->is_null()) return false;
  double x = 0;
  get(key, x, lo, hi);
  out = x;
  return true;
}

bool SectionReader::get(const char* key, std::optional<std::string>& out) {
  const json* v = raw(key);
  if (!v || v->is_null()) return false;
  std::string s;
  get(key, s);
  out = s;
  return true;
}

bool SectionReader::get(const char* key, std::optional<bool>& out) {
  const json* v = raw(key);
  if (!v || v->is_null()) return false;
  bool b = false;
  get(key, b);
  out = b;
  return true;
}

void SectionReader::finish() const {
  std::vector<std::string> names(known_.begin(), known_.end());
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (known_.count(it.key())) continue;
    throw ConfigError(path(it.key().c_str()), "DeepSpeed config: unknown key '" + path(it.key().c_str()) +
                                                  "'" + did_you_mean(it.key(), names) +
                                                  (path_.empty() ? "" : " (in section '" + path_ + "')"));
  }
}

}  // namespace dscpp::config_detail
