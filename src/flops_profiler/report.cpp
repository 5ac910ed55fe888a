// Flops profiler report: summary, per-depth aggregates, detailed tree.
#include "dscpp/flops_profiler/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <vector>

#include "dscpp/core/check.h"

namespace dscpp {

ModuleTimeMap module_times(Profiler& p) {
  ModuleTimeMap out;
  for (const RangeRecord& r : p.ranges()) {
    if (r.host_end_ns < 0 || (r.phase != Phase::forward && r.phase != Phase::backward)) continue;
    ModuleTimes& t = out[r.path()];
    if (r.phase == Phase::forward) {
      t.fwd_ms += r.ms();
      t.fwd_calls++;
    } else {
      t.bwd_ms += r.ms();
      t.bwd_calls++;
    }
  }
  return out;
}

StepSummary summarize_step(const FlopsTotals& t, const StepMeasure& m) {
  StepSummary s;
  s.iter_ms = m.fwd_ms + m.bwd_ms + m.step_ms;
  if (s.iter_ms > 0) {
    s.tokens_per_s = double(m.tokens) / (s.iter_ms * 1e-3);
    s.samples_per_s = double(m.samples) / (s.iter_ms * 1e-3);
    s.model_flops_per_s = t.model_flops_per_token * s.tokens_per_s / m.model_parallel;
    s.hw_flops_per_s = t.model_flops_recompute_per_token * s.tokens_per_s / m.model_parallel;
    if (m.peak_flops > 0) s.mfu = s.model_flops_per_s / m.peak_flops;
  }
  return s;
}

std::string format_si(double v, const std::string& unit, int precision) {
  static const char* up[] = {"", "K", "M", "G", "T", "P", "E"};
  static const char* down[] = {"", "m", "u", "n"};
  const char* prefix = "";
  double a = std::fabs(v);
  for (int i = 0; a >= 1000.0 && i < 6; i++, prefix = up[i]) {
    a /= 1000.0;
    v /= 1000.0;
  }
  for (int i = 0; a > 0 && a < 1.0 && i < 3; i++, prefix = down[i]) {
    a *= 1000.0;
    v *= 1000.0;
  }
  char buf[64];
  if (*prefix == 0 && v == std::floor(v)) precision = 0;  // "256 params", "0 MACs"
  std::snprintf(buf, sizeof buf, "%.*f %s%s", precision, v, prefix, unit.c_str());
  return buf;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  DSCPP_CHECK(f.good(), "cannot open '", path, "' for writing");
  f << text;
  f.close();
  DSCPP_CHECK(f.good(), "failed writing '", path, "'");
}

namespace {

std::string ms_str(double ms) { return ms > 0 ? format_si(ms * 1e-3, "s") : "-"; }
std::string rate_str(double flops, double ms) { return ms > 0 ? format_si(flops / (ms * 1e-3), "FLOPS") : "-"; }
std::string pct(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

void row(std::string& s, const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-72s %s\n", (label + ":").c_str(), value.c_str());
  s += buf;
}

struct Agg {
  int64_t params = 0;
  double macs = 0, fwd_ms = 0, bwd_ms = 0;
};

void per_depth(std::string& s, const ModuleNode& root, const ModuleTimeMap& times, const ReportOptions& o) {
  std::vector<std::map<std::string, Agg>> depths;
  std::function<void(const ModuleNode&)> walk = [&](const ModuleNode& n) {
    if (o.module_depth >= 0 && n.depth > o.module_depth) return;
    if (depths.size() <= size_t(n.depth)) depths.resize(size_t(n.depth) + 1);
    Agg& a = depths[size_t(n.depth)][n.kind];
    a.params += n.params;
    a.macs += n.cost.macs;
    if (auto it = times.find(n.path); it != times.end()) {
      a.fwd_ms += it->second.fwd_ms;
      a.bwd_ms += it->second.bwd_ms;
    }
    for (const ModuleNode& c : n.children) walk(c);
  };
  walk(root);
  const int k = std::max(1, o.top_modules);
  auto top = [&](const std::map<std::string, Agg>& m, std::function<double(const Agg&)> key,
                 std::function<std::string(const Agg&)> fmt) {
    std::vector<std::pair<std::string, Agg>> v(m.begin(), m.end());
    std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a.second) > key(b.second); });
    std::string out = "{";
    for (int i = 0; i < k && i < int(v.size()); i++)
      out += (i ? ", '" : "'") + v[size_t(i)].first + "': '" + fmt(v[size_t(i)].second) + "'";
    return out + "}";
  };
  s += "Top modules in terms of params, MACs or fwd/bwd latency at different model depths:\n";
  for (size_t d = 0; d < depths.size(); d++) {
    s += "depth " + std::to_string(d) + ":\n";
    s += "    params      - " + top(depths[d], [](const Agg& a) { return double(a.params); },
                                  [](const Agg& a) { return format_si(double(a.params), ""); }) + "\n";
    s += "    MACs        - " + top(depths[d], [](const Agg& a) { return a.macs; },
                                  [](const Agg& a) { return format_si(a.macs, "MACs"); }) + "\n";
    if (times.empty()) continue;  // analytic profile: nothing measured
    s += "    fwd latency - " + top(depths[d], [](const Agg& a) { return a.fwd_ms; },
                                  [](const Agg& a) { return ms_str(a.fwd_ms); }) + "\n";
    s += "    bwd latency - " + top(depths[d], [](const Agg& a) { return a.bwd_ms; },
                                  [](const Agg& a) { return ms_str(a.bwd_ms); }) + "\n";
  }
}

void detailed(std::string& s, const ModuleNode& n, const ModuleNode& root, const ModuleTimeMap& times,
              const ReportOptions& o, int tp) {
  if (o.module_depth >= 0 && n.depth > o.module_depth) return;
  const ModuleTimes* t = nullptr;
  if (auto it = times.find(n.path); it != times.end()) t = &it->second;
  const ModuleTimes* rt = nullptr;
  if (auto it = times.find(root.path); it != times.end()) rt = &it->second;
  const double fwd = t ? t->fwd_ms : 0, bwd = t ? t->bwd_ms : 0;
  std::string indent(size_t(2 * n.depth), ' ');
  s += indent + n.name + " (" + n.kind + (n.checkpointed ? ", checkpointed" : "") + "): " +
       format_si(double(n.params), "params") + " (" + pct(double(n.params), double(root.params)) + "), " +
       format_si(n.cost.macs, "MACs") + " (" + pct(n.cost.macs, root.cost.macs) + "), fwd " +
       format_si(n.fwd_flops(), "FLOPs");
  if (!times.empty())
    s += ", fwd " + ms_str(fwd) + " (" + pct(fwd, rt ? rt->fwd_ms : 0) + ") " + rate_str(n.fwd_flops() / tp, fwd) +
         ", bwd " + ms_str(bwd) + " (" + pct(bwd, rt ? rt->bwd_ms : 0) + ") " + rate_str(n.bwd_flops() / tp, bwd);
  s += "\n";
  for (const ModuleNode& c : n.children) detailed(s, c, root, times, o, tp);
}

}  // namespace

std::string format_flops_profile(const ModuleNode& tree, const ModuleTimeMap& times, const StepMeasure& m,
                                 const ReportOptions& o) {
  DSCPP_CHECK(m.tokens > 0, "flops profile: tokens per step must be positive, got ", m.tokens);
  const FlopsTotals t = flops_totals(tree, m.tokens);
  const StepSummary st = summarize_step(t, m);
  const double r = t.recompute_fwd_factor, fwd = tree.fwd_flops();
  std::string s;
  s += "-------------------------- DeepSpeed.cpp Flops Profiler --------------------------\n";
  s += "Profile Summary at step " + std::to_string(o.profile_step) + ":\n";
  s += "Notations: params (parameters), MACs (multiply-accumulates), FLOPs (floating-point operations; matmul =\n"
       "2 x MACs, other = elementwise), FLOPS (per second), model FLOPs (matmuls only, without recomputation: the\n"
       "MFU numerator), fwd/bwd latency (forward/backward), step (optimizer), iter (fwd + bwd + step).\n\n";
  row(s, "world size", std::to_string(m.world_size));
  if (m.model_parallel > 1)
    row(s, "model parallel (tp x pp; the counts below are the whole model's)", std::to_string(m.model_parallel));
  row(s, "samples per device per step", std::to_string(m.samples));
  row(s, "tokens per device per step", std::to_string(m.tokens));
  row(s, "params per device", format_si(double(t.params), ""));
  row(s, "fwd MACs per device", format_si(tree.cost.macs, "MACs"));
  row(s, "fwd FLOPs per device (matmul + other)",
      format_si(fwd, "") + " (" + format_si(tree.cost.matmul_flops, "") + " + " + format_si(tree.cost.other_flops, "") + ")");
  row(s, "model FLOPs per token (3 x fwd matmul FLOPs)", format_si(t.model_flops_per_token, ""));
  row(s, "model FLOPs per token with recomputation", format_si(t.model_flops_recompute_per_token, ""));
  row(s, "all FLOPs per token (fwd + bwd + recompute, elementwise included)", format_si(t.total_flops_per_token, ""));
  char rbuf[32];
  std::snprintf(rbuf, sizeof rbuf, "%.3f", r);
  row(s, "recompute fwd factor (recomputed / fwd FLOPs)", rbuf);
  // The latencies are this device's, which runs 1 / (tp x pp) of the model's FLOPs (its stage's layers, its slice
  // of each); the whole model's FLOPs over them would read tp x pp too high.
  const double dev_fwd = fwd / m.model_parallel;
  const std::string per = m.model_parallel > 1 ? " / (tp x pp)" : "";
  row(s, "fwd latency", ms_str(m.fwd_ms));
  row(s, "fwd FLOPS per device = fwd flops" + per + " / fwd latency", rate_str(dev_fwd, m.fwd_ms));
  row(s, "bwd latency", ms_str(m.bwd_ms));
  row(s, "bwd FLOPS per device = (2 + r) * fwd flops" + per + " / bwd latency",
      rate_str((2.0 + r) * dev_fwd, m.bwd_ms));
  row(s, "fwd+bwd FLOPS per device = (3 + r) * fwd flops" + per + " / (fwd+bwd latency)",
      rate_str((3.0 + r) * dev_fwd, m.fwd_ms + m.bwd_ms));
  row(s, "step latency", ms_str(m.step_ms));
  row(s, "iter latency", ms_str(st.iter_ms));
  row(s, "tokens/second per device", st.iter_ms > 0 ? format_si(st.tokens_per_s, "") : "-");
  row(s, "samples/second per device", st.iter_ms > 0 ? format_si(st.samples_per_s, "") : "-");
  row(s, m.model_parallel > 1 ? "model FLOPS per device = model FLOPs per token * tokens/s / (tp x pp)"
                              : "model FLOPS per device = model FLOPs per token * tokens/s",
      st.iter_ms > 0 ? format_si(st.model_flops_per_s, "FLOPS") : "-");
  row(s, "hardware FLOPS per device (with recomputation)", st.iter_ms > 0 ? format_si(st.hw_flops_per_s, "FLOPS") : "-");
  char mfu[64];
  if (st.mfu >= 0) std::snprintf(mfu, sizeof mfu, "%.2f%% of %s", 100.0 * st.mfu, format_si(m.peak_flops, "FLOPS").c_str());
  else std::snprintf(mfu, sizeof mfu, "N/A (no peak given)");
  row(s, "MFU = model FLOPS / peak", st.iter_ms > 0 ? mfu : "-");
  s += "\n----------------------------- Aggregated Profile per Device -----------------------------\n";
  per_depth(s, tree, times, o);
  if (o.detailed) {
    s += "\n------------------------------ Detailed Profile per Device ------------------------------\n";
    s += "Each module: params (% of total), fwd MACs (% of total), fwd FLOPs, fwd latency (% of model fwd) and\n"
         "achieved fwd FLOPS, bwd latency (% of model bwd) and achieved bwd FLOPS (bwd FLOPs include recompute).\n";
    if (m.tensor_parallel > 1)
      s += "Counts are the whole module's; the achieved FLOPS divide them by tp = " + std::to_string(m.tensor_parallel) +
           " (this device's slice).\n";
    s += "\n";
    detailed(s, tree, tree, times, o, std::max(1, m.tensor_parallel));
  }
  s += "------------------------------------------------------------------------------------------\n";
  return s;
}

}  // namespace dscpp
