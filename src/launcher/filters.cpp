// --include/--exclude and --num_nodes/--num_gpus over a resource pool, with DeepSpeed's rules and messages
// (launcher/runner.py parse_resource_filter and main). One deliberate difference: --num_gpus larger than a host's
// slot count is an error here; DeepSpeed silently hands out slots the host does not have.
#include <algorithm>

#include "dscpp/core/check.h"
#include "dscpp/launcher/resources.h"

namespace dscpp::launcher {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {  // "a,,b," -> {a, "", b, ""}; "" -> {""}
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

const Host* find_host(const Resources& r, const std::string& name) {
  for (auto& h : r)
    if (h.name == name) return &h;
  return nullptr;
}

int parse_slot(const std::string& tok, const std::string& flag, const std::string& spec) {
  bool ok = !tok.empty() && tok.size() < 7 && std::all_of(tok.begin(), tok.end(), ::isdigit);
  if (!ok) DSCPP_FAIL(flag, " '", spec, "': slot '", tok, "' is not a non-negative integer");
  return std::stoi(tok);
}

}  // namespace

Resources filter_resources(const Resources& pool, const std::string& include, const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) DSCPP_FAIL("include_str and exclude_str are mutually exclusive.");
  if (include.empty() && exclude.empty()) return pool;
  const bool inc = !include.empty();
  const std::string& spec = inc ? include : exclude;
  const std::string flag = inc ? "--include" : "--exclude";
  Resources chosen = inc ? Resources{} : pool;  // include: what was named; exclude: what is left
  auto slots_of = [&](const std::string& name) -> std::vector<int>& {
    for (auto& h : chosen)
      if (h.name == name) return h.slots;
    chosen.push_back({name, {}});
    return chosen.back().slots;
  };
  for (const std::string& node : split(spec, '@')) {
    size_t colon = node.find(':');
    std::string name = node.substr(0, colon);
    if (name.empty()) DSCPP_FAIL(flag, " '", spec, "': empty host name in '", node, "'");
    const Host* h = find_host(pool, name);
    if (!h) DSCPP_FAIL("Hostname '", name, "' not found in hostfile (", flag, " '", spec, "')");
    std::vector<int>& dst = slots_of(name);
    if (colon == std::string::npos) {  // the whole node
      if (inc) dst = h->slots;
      else dst.clear();
      continue;
    }
    for (const std::string& tok : split(node.substr(colon + 1), ',')) {
      int slot = parse_slot(tok, flag, spec);
      if (std::find(h->slots.begin(), h->slots.end(), slot) == h->slots.end())
        DSCPP_FAIL("No slot '", slot, "' specified on host '", name, "'");
      if (inc) dst.push_back(slot);
      else dst.erase(std::remove(dst.begin(), dst.end(), slot), dst.end());
    }
  }
  Resources out;  // in the pool's order, slots sorted and unique, empty hosts dropped
  for (auto& p : pool)
    for (auto& c : chosen)
      if (c.name == p.name && !c.slots.empty()) {
        std::vector<int> s = c.slots;
        std::sort(s.begin(), s.end());
        s.erase(std::unique(s.begin(), s.end()), s.end());
        out.push_back({c.name, s});
      }
  if (out.empty()) DSCPP_FAIL(flag, " '", spec, "' leaves no slots to run on");
  return out;
}

Resources limit_resources(const Resources& pool, int num_nodes, int num_gpus) {
  Resources out = pool;
  if (num_nodes > 0 && (size_t)num_nodes < out.size()) out.resize(num_nodes);
  if (num_nodes > 0 && (size_t)num_nodes > pool.size())
    DSCPP_FAIL("--num_nodes ", num_nodes, " but only ", pool.size(), " node(s) are available: ", format_resources(pool));
  if (num_gpus > 0)
    for (auto& h : out) {
      if ((int)h.slots.size() < num_gpus)
        DSCPP_FAIL("--num_gpus ", num_gpus, " but host '", h.name, "' has only ", h.slots.size(), " slot(s)");
      h.slots.clear();
      for (int s = 0; s < num_gpus; s++) h.slots.push_back(s);
    }
  return out;
}

int world_size(const Resources& r) {
  int n = 0;
  for (auto& h : r) n += (int)h.slots.size();
  return n;
}

int first_rank(const Resources& r, int node_rank) {
  DSCPP_CHECK(node_rank >= 0 && node_rank < (int)r.size(), "node_rank ", node_rank, " out of range for ", r.size(),
              " node(s)");
  int n = 0;
  for (int i = 0; i < node_rank; i++) n += (int)r[i].slots.size();
  return n;
}

std::string format_resources(const Resources& r) {
  std::string s;
  for (auto& h : r) {
    if (!s.empty()) s += "@";
    s += h.name + ":";
    for (size_t i = 0; i < h.slots.size(); i++) s.append(i ? "," : "").append(std::to_string(h.slots[i]));
  }
  return s;
}

}  // namespace dscpp::launcher
