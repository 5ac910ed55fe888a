// DeepSpeed hostfile parsing. A line is `hostname slots=N` (DeepSpeed's regex `^(\S+)\s+slots=(\d+)`); `#` comments
// and blank lines are skipped. Text after the slots field is allowed when separated by whitespace (OpenMPI
// hostfiles carry `max_slots=`), but `slots=4x` is a bad entry rather than silently 4.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/core/check.h"
#include "dscpp/launcher/resources.h"

namespace dscpp::launcher {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace((unsigned char)s[b])) b++;
  while (e > b && std::isspace((unsigned char)s[e - 1])) e--;
  return s.substr(b, e - b);
}

// Returns the slot count, or -1 when the line does not match `host slots=N[ <anything>]`.
int match_entry(const std::string& line, std::string* host) {
  size_t i = 0;
  while (i < line.size() && !std::isspace((unsigned char)line[i])) i++;
  *host = line.substr(0, i);
  size_t j = i;
  while (j < line.size() && std::isspace((unsigned char)line[j])) j++;
  if (j == i || line.compare(j, 6, "slots=") != 0) return -1;
  j += 6;
  size_t k = j;
  while (k < line.size() && std::isdigit((unsigned char)line[k])) k++;
  if (k == j || k - j > 6) return -1;
  if (k < line.size() && !std::isspace((unsigned char)line[k])) return -1;
  return std::stoi(line.substr(j, k - j));
}

}  // namespace

Resources parse_hostfile(const std::string& text, const std::string& source) {
  Resources pool;
  std::istringstream in(text);
  std::string raw;
  for (int lineno = 1; std::getline(in, raw); lineno++) {
    std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    std::string host;
    int slots = match_entry(line, &host);
    if (slots < 0)
      DSCPP_FAIL(source, " line ", lineno, ": Hostfile contains a bad entry: '", line,
                 "', unable to proceed with launching (expected 'hostname slots=N')");
    if (slots == 0)
      DSCPP_FAIL(source, " line ", lineno, ": Hostfile contains a bad entry: '", line,
                 "', unable to proceed with launching (slots must be at least 1)");
    for (auto& h : pool)
      if (h.name == host)
        DSCPP_FAIL(source, " line ", lineno, ": Hostfile contains multiple entries for ", host,
                   ", unable to proceed with launching ('", line, "')");
    Host h{host, {}};
    for (int s = 0; s < slots; s++) h.slots.push_back(s);
    pool.push_back(std::move(h));
  }
  if (pool.empty()) DSCPP_FAIL(source, ": Hostfile is empty or not formatted correctly, unable to proceed with launching.");
  return pool;
}

std::optional<Resources> read_hostfile(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  DSCPP_CHECK(in.good(), "cannot read hostfile ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_hostfile(ss.str(), "hostfile " + path);
}

int local_gpu_count() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    n++;
  return n;
}

}  // namespace dscpp::launcher
