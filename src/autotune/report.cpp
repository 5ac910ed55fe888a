#include "dscpp/autotune/report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "autotune/svg_chart.h"
#include "dscpp/autotune/space.h"
#include "dscpp/core/check.h"

namespace fs = std::filesystem;

namespace dscpp::autotune {

namespace {

const char* kStageColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"};

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string gib(int64_t b) { return b > 0 ? bytes_text(b) : "-"; }

std::string choice_text(const Choice& c) {
  std::string s;
  for (const auto& [path, v] : c) {
    const std::string key = path.substr(path.rfind('.') + 1);
    const std::string name = path == "zero_optimization.offload_optimizer.device" ? "offload_optimizer" : key;
    s += (s.empty() ? "" : ", ") + name + "=" + (v.is_null() ? std::string("off") : v.is_string() ? v.get<std::string>()
                                                                                                    : v.dump());
  }
  return s.empty() ? "-" : s;
}

std::string metric_label(const std::string& metric) {
  return metric + " (" + metric_unit(metric) + ")";
}

std::string duration_text(double s) {  // Python's str(timedelta): H:MM:SS.ffffff
  const int64_t us = int64_t(s * 1e6);
  char b[48];
  std::snprintf(b, sizeof b, "%lld:%02lld:%02lld.%06lld", (long long)(us / 3600000000LL),
                (long long)(us / 60000000LL % 60), (long long)(us / 1000000LL % 60), (long long)(us % 1000000LL));
  return b;
}

// Fixed-width text table: the first row is the header.
std::string text_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); i++) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::string o;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); i++) {
      std::string cell = r[i];
      cell.resize(i + 1 == r.size() ? cell.size() : w[i], ' ');
      line += (i ? "  " : "") + cell;
    }
    o += line + "\n";
  }
  return o;
}

std::vector<std::string> trial_row(const AutotuneResult& r, size_t i, const std::string& metric, int rank) {
  const Record& rec = r.records[i];
  const Metrics& m = *rec.result->metrics;
  return {std::to_string(rank), rec.exp.name, std::to_string(rec.exp.stage), std::to_string(rec.exp.micro_batch),
          std::to_string(rec.exp.gas), fmt("%.4g", metric_value(m, metric)), fmt("%.0f", m.tokens_per_second),
          fmt("%.2f", m.latency_ms), gib(rec.exp.predicted_peak) + " / " + gib(m.peak_memory_bytes),
          fmt("%.1f", rec.result->wall_seconds) + (rec.result->reused ? " (reused)" : ""), choice_text(rec.exp.choice)};
}

std::vector<std::string> stage_lines(const AutotuneResult& r) {
  std::vector<std::string> out;
  for (const StageReport& s : r.stages) {
    std::string line = "stage " + std::to_string(s.stage) + ": " + s.status;
    for (const auto& n : s.notes) line += "; " + n;
    int failed = 0;
    std::map<std::string, int> kinds;
    for (const auto& rec : r.records)
      if (rec.exp.stage == s.stage && rec.state == Record::State::ran && !rec.result->metrics)
        failed++, kinds[outcome_name(rec.result->outcome)]++;
    if (failed) {
      line += "; " + std::to_string(failed) + " trial(s) failed (";
      std::string k;
      for (const auto& [name, n] : kinds) k += (k.empty() ? "" : ", ") + name + " " + std::to_string(n);
      line += k + ")";
    }
    if (s.best) line += "; best " + r.records[*s.best].exp.name;
    out.push_back(line);
  }
  return out;
}

int count_state(const AutotuneResult& r, Record::State st) {
  return int(std::count_if(r.records.begin(), r.records.end(), [&](const Record& x) { return x.state == st; }));
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  f << text;
  DSCPP_CHECK(f.good(), "autotune: cannot write ", p.string());
}

}  // namespace

std::string format_ranked_table(const AutotuneResult& r, const AutotuneInputs& in) {
  const std::string& metric = in.at.metric;
  std::ostringstream o;
  const std::vector<size_t> ranked = ranked_trials(r, metric);
  if (!ranked.empty()) {
    o << "Trials ranked by " << metric_label(metric) << ", best first:\n";
    std::vector<std::vector<std::string>> rows = {{"rank", "experiment", "stage", "mbs", "gas", metric, "tokens/s",
                                                   "ms/step", "peak predicted / measured", "wall s", "tuned keys"}};
    int rank = 1;
    for (size_t i : ranked) rows.push_back(trial_row(r, i, metric, rank++));
    o << text_table(rows);
  } else {
    o << "No trial ran successfully. Why, stage by stage:\n";
  }
  o << "Stages:\n";
  for (const auto& l : stage_lines(r)) o << "  " << l << "\n";
  bool header = false;
  for (const auto& rec : r.records)
    if (rec.state == Record::State::ran && !rec.result->metrics) {
      if (!header) o << "Failed trials:\n", header = true;
      o << "  " << rec.exp.name << ": " << outcome_name(rec.result->outcome) << ": " << rec.result->reason << "\n";
    }
  o << "Not launched: " << count_state(r, Record::State::pruned) << " pruned by memory, "
    << count_state(r, Record::State::layout) << " pruned by layout, " << count_state(r, Record::State::duplicate) << " equal to a trial already run, "
    << count_state(r, Record::State::invalid) << " invalid; ";
  int merged = 0;
  for (const auto& [why, n] : r.collapsed) merged += n;
  o << merged << " space points merged into others (keys with no effect here)\n";
  o << "Trials: " << r.trials_run << " run, " << r.trials_reused << " reused, in " << fmt("%.1f", r.seconds) << " s\n";
  return o.str();
}

std::string format_summary(const AutotuneResult& r, const AutotuneInputs& in) {
  std::map<std::string, std::pair<std::optional<size_t>, int>> spaces;  // space -> best record, experiments
  for (size_t i = 0; i < r.records.size(); i++) {
    const Record& rec = r.records[i];
    if (rec.state != Record::State::ran) continue;
    auto& [best, n] = spaces[rec.exp.space];
    n++;
    if (rec.result->metrics && (!best || metric_score(*rec.result->metrics, in.at.metric) >
                                             metric_score(*r.records[*best].result->metrics, in.at.metric)))
      best = i;
  }
  std::vector<std::vector<std::string>> rows = {{"tuning_space", "num_experiments", "best_metric_val", "best_exp_name"}};
  int total = 0;
  for (const auto& [name, v] : spaces) {
    total += v.second;
    rows.push_back({name, std::to_string(v.second),
                    v.first ? fmt("%.6g", metric_value(*r.records[*v.first].result->metrics, in.at.metric)) : "-",
                    v.first ? r.records[*v.first].exp.name : "-"});
  }
  rows.push_back({"global", std::to_string(total),
                  r.best ? fmt("%.6g", metric_value(*r.records[*r.best].result->metrics, in.at.metric)) : "-",
                  r.best ? r.records[*r.best].exp.name : "-"});
  std::string o;
  for (size_t k = 0; k < rows.size(); k++) {
    std::string line = "|";
    for (const auto& c : rows[k]) line += " " + c + " |";
    o += line + "\n";
    if (k == 0) o += "|:---|---:|:---|:---|\n";
  }
  return o + "\n\nTuning completed in " + duration_text(r.seconds) + ". Total number of experiments: " +
         std::to_string(total) + ".\n";
}

std::string format_html_report(const AutotuneResult& r, const AutotuneInputs& in, const ReportContext& ctx) {
  const std::string& metric = in.at.metric;
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>DeepSpeed.cpp autotuning report</title>\n"
       "<style>body{font-family:sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse;"
       "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f3f3f3}"
       ".fail{color:#b00}.note{color:#555}pre{background:#f7f7f7;padding:8px;font-size:12px;white-space:pre-wrap}"
       "</style></head><body>\n<h1>Autotuning report</h1>\n";
  o << "<p>" << html_escape(ctx.model) << "<br>" << html_escape(ctx.resources) << "<br>Memory limit per rank: "
    << bytes_text(in.memory_limit) << " (" << html_escape(in.memory_limit_why) << ")<br>Batch: "
    << html_escape(r.batch_rules) << "<br>Metric: " << html_escape(metric_label(metric)) << "; tuner "
    << html_escape(in.at.tuner_type) << (in.at.fast ? ", fast mode (micro-batch per stage only)" : "")
    << "<br>Trials: " << r.trials_run << " run, " << r.trials_reused << " reused, "
    << count_state(r, Record::State::pruned) << " pruned by memory, " << count_state(r, Record::State::layout)
    << " pruned by layout, " << count_state(r, Record::State::duplicate)
    << " equal to a trial already run, " << count_state(r, Record::State::invalid) << " invalid; "
    << fmt("%.1f", r.seconds) << " s</p>\n";
  if (r.best) {
    const Record& b = r.records[*r.best];
    o << "<h2>Best: " << html_escape(b.exp.name) << "</h2>\n<p>" << html_escape(metric_label(metric)) << " "
      << fmt("%.6g", metric_value(*b.result->metrics, metric)) << ", " << fmt("%.0f", b.result->metrics->tokens_per_second)
      << " tokens/s, " << fmt("%.2f", b.result->metrics->latency_ms) << " ms per step; predicted peak "
      << gib(b.exp.predicted_peak) << ", measured " << gib(b.result->metrics->peak_memory_bytes) << "</p>\n"
      << "<pre>" << html_escape(ctx.optimal_command) << "</pre>\n<pre>" << html_escape(b.exp.ds_config.dump(2))
      << "</pre>\n";
  } else {
    o << "<h2 class=\"fail\">No trial ran successfully</h2>\n<p>Why, stage by stage, below.</p>\n";
  }
  o << "<h2>Stages</h2>\n<ul>\n";
  for (const auto& l : stage_lines(r)) o << "<li>" << html_escape(l) << "</li>\n";
  o << "</ul>\n";

  std::vector<ChartSeries> by_trial(4), by_mbs(4);
  for (int s = 0; s < 4; s++) {
    by_trial[size_t(s)] = {"stage " + std::to_string(s), kStageColors[s], {}, false};
    by_mbs[size_t(s)] = {"stage " + std::to_string(s), kStageColors[s], {}, true};
  }
  std::map<std::pair<int, int64_t>, ChartPoint> best_at;  // (stage, mbs) -> the best point
  int n = 0;
  for (const auto& rec : r.records) {
    if (rec.state != Record::State::ran) continue;
    n++;
    const bool ok = bool(rec.result->metrics);
    const double v = ok ? metric_value(*rec.result->metrics, metric) : 0;
    const std::string label = rec.exp.name + ": " + (ok ? fmt("%.4g", v) : std::string(outcome_name(rec.result->outcome)));
    by_trial[size_t(rec.exp.stage)].points.push_back({double(n), v, label, !ok});
    auto key = std::make_pair(rec.exp.stage, rec.exp.micro_batch);
    auto it = best_at.find(key);
    const bool better = it == best_at.end() || (it->second.failed && ok) ||
                        (ok && metric_score(*rec.result->metrics, metric) >
                                   (metric == "latency" ? 1000.0 / it->second.y : it->second.y));
    if (better) best_at[key] = {double(rec.exp.micro_batch), v, label, !ok};
  }
  for (const auto& [key, p] : best_at) by_mbs[size_t(key.first)].points.push_back(p);
  auto used = [](std::vector<ChartSeries> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const ChartSeries& s) { return s.points.empty(); }), v.end());
    return v;
  };
  o << "<h2>Charts</h2>\n";
  if (n == 0) {
    o << "<p>No trial ran: nothing to chart.</p>\n";
  } else {
    o << svg_chart(metric_label(metric) + " by trial", "trial (in the order run)", metric_label(metric),
                   used(by_trial));
    o << svg_chart(metric_label(metric) + " by micro-batch, per stage (the best at each)", "micro-batch per GPU",
                   metric_label(metric), used(by_mbs));
    if (std::any_of(r.records.begin(), r.records.end(), [](const Record& x) {
          return x.state == Record::State::ran && !x.result->metrics;
        }))
      o << "<p class=\"note\">Red crosses: failed trials (hover for the reason).</p>\n";
  }

  o << "<h2>Trials</h2>\n<table><tr><th>rank</th><th>experiment</th><th>stage</th><th>mbs</th><th>gas</th><th>"
    << html_escape(metric) << "</th><th>tokens/s</th><th>ms/step</th><th>peak predicted / measured</th><th>wall s</th>"
       "<th>tuned keys</th></tr>\n";
  int rank = 1;
  for (size_t i : ranked_trials(r, metric)) {
    o << "<tr>";
    for (const auto& c : trial_row(r, i, metric, rank++)) o << "<td>" << html_escape(c) << "</td>";
    o << "</tr>\n";
  }
  o << "</table>\n<h2>Failed, pruned and merged candidates</h2>\n<table><tr><th>experiment</th><th>state</th>"
       "<th>predicted peak</th><th>why</th></tr>\n";
  for (const auto& rec : r.records) {
    if (rec.state == Record::State::ran && rec.result->metrics) continue;
    const std::string state = rec.state == Record::State::ran ? outcome_name(rec.result->outcome) : state_name(rec.state);
    const std::string why = rec.state == Record::State::ran ? rec.result->reason : rec.note;
    o << "<tr class=\"" << (rec.state == Record::State::ran ? "fail" : "note") << "\"><td>" << html_escape(rec.exp.name)
      << "</td><td>" << html_escape(state) << "</td><td>" << gib(rec.exp.predicted_peak) << "</td><td>"
      << html_escape(why) << "</td></tr>\n";
  }
  for (const auto& [why, count] : r.collapsed)
    o << "<tr class=\"note\"><td>" << count << " space point(s)</td><td>merged</td><td></td><td>"
      << html_escape(why) << "</td></tr>\n";
  o << "</table>\n</body></html>\n";
  return o.str();
}

std::string write_outputs(const AutotuneResult& r, const AutotuneInputs& in, const ReportContext& ctx) {
  const fs::path dir = in.at.results_dir;
  fs::create_directories(dir);
  write_file(dir / "summary.txt", format_summary(r, in));
  write_file(dir / "autotuning_report.html", format_html_report(r, in, ctx));
  if (!r.best) return "";
  const fs::path best = dir / "ds_config_optimal.json";
  write_file(best, r.records[*r.best].exp.ds_config.dump(2) + "\n");
  write_file(dir / "cmd_optimal.txt", ctx.optimal_command + "\n");
  return best.string();
}

}  // namespace dscpp::autotune
