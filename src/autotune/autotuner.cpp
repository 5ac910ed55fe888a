#include "dscpp/autotune/autotuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ostream>
#include <set>

#include "dscpp/autotune/micro_batch.h"
#include "dscpp/autotune/space.h"
#include "dscpp/autotune/tuner.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/training_memory.h"

namespace dscpp::autotune {

const char* state_name(Record::State s) {
  switch (s) {
    case Record::State::ran: return "ran";
    case Record::State::pruned: return "pruned";
    case Record::State::layout: return "pruned (layout)";
    case Record::State::duplicate: return "duplicate";
    case Record::State::invalid: return "invalid";
  }
  return "?";
}

int base_data_parallel_ranks(const json& user_config, int world) {
  const UserSpace u = split_user_config(user_config);
  const Choice first = first_choice(u);
  if (const int dp = data_parallel_ranks(first, u.base, world)) return dp;
  const int tp = layout_degree(first, u.base, "tensor_parallel.autotp_size");
  const int pp = layout_degree(first, u.base, "pipeline.stages");
  throw ConfigError(pp > 1 ? "pipeline.stages" : "tensor_parallel.autotp_size",
                    "DeepSpeed config: tensor_parallel degree " + std::to_string(tp) + " x pipeline.stages " +
                        std::to_string(pp) + " = " + std::to_string(tp * pp) + " does not divide the " +
                        std::to_string(world) + " ranks of a trial: the ranks form tp x pp x dp");
}

namespace {

// The peak per rank of a tp x pp layout: the most any pipeline stage's rank holds (Note [Pipeline memory estimate]).
// ZeRO's gathered parameters and gradient windows are not in it; the memory reserve covers them.
TrainingMemoryEstimate estimate_layout_memory(const ModelConfig& model, const DeepSpeedConfig& cfg, int64_t seq_len,
                                              bool cuda) {
  TrainingMemoryInputs in = training_memory_inputs(model, cfg, seq_len, cuda);
  PipelineLayout lay;
  lay.tp = cfg.tp_size(), lay.pp = cfg.pp_size(), lay.dp = cfg.dp_world_size;
  lay.virtual_stages = int(cfg.dscpp.pipeline.virtual_stages);
  lay.partition_method = cfg.pipeline.partition;
  lay.micro_batches = cfg.gradient_accumulation_steps;
  if (lay.pp > 1 && cfg.pipeline.activation_checkpoint_interval == 1)  // as initialize_pipeline: every block
    in.workload.checkpoint = CheckpointPolicy(size_t(model.n_layer), true);
  TrainingMemoryEstimate e;
  const std::vector<StageMemory> stages = estimate_pipeline_memory(model, lay, in.workload, in.setup);
  for (size_t s = 0; s < stages.size(); s++)
    if (stages[s].peak_bytes() > e.peak_bytes) {
      e.peak_bytes = stages[s].peak_bytes();
      e.states = stages[s].states;
      e.peak_at = "tp " + std::to_string(lay.tp) + " x pp " + std::to_string(lay.pp) + " x dp " +
                  std::to_string(lay.dp) + (lay.pp > 1 ? ", pipeline stage " + std::to_string(s) : "") + ": " +
                  stages[s].peak_at;
    }
  return e;
}

}  // namespace

std::vector<size_t> ranked_trials(const AutotuneResult& r, const std::string& metric) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < r.records.size(); i++)
    if (r.records[i].state == Record::State::ran && r.records[i].result->metrics) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return metric_score(*r.records[a].result->metrics, metric) > metric_score(*r.records[b].result->metrics, metric);
  });
  return idx;
}

struct Autotuner::Impl {
  const AutotuneInputs& in;
  TrialRunner& runner;
  int parallel;
  std::ostream& log;
  UserSpace user;
  BatchRules rules;  // the base layout's (the first point of the space)
  SpaceContext ctx;
  AutotuneResult res;
  std::map<std::string, size_t> seen;  // canonical config -> the record that ran (or was pruned) with it

  struct Planned {
    Experiment exp;
    std::string canon;   // the resolved config, compact: equal for configs the engine runs alike
    std::string error;   // the config's ConfigError, if any
    std::string layout;  // why the ranks cannot hold the choice's tp x pp layout (Note [Layouts]), if they cannot
  };
  struct Fit {
    int64_t mbs = 0;     // the largest allowed micro-batch that fits; 0: none
    std::string why;     // the numbers that bound it
    std::string error;   // a ConfigError of the config itself
    std::string layout;  // as Planned's
  };
  struct Layout {
    int tp = 1, pp = 1, dp = 1;
    BatchRules rules;     // the batch rules over its dp ranks
    std::string problem;  // why the ranks cannot hold it ("": they can)
  };

  Impl(const AutotuneInputs& i, TrialRunner& r, int p, std::ostream& l)
      : in(i), runner(r), parallel(p), log(l), user(split_user_config(i.user_config)),
        rules(batch_rules(i.user_config, i.at, base_data_parallel_ranks(i.user_config, i.world))),
        ctx{i.world, i.cuda, i.model.n_layer} {}

  std::string gib(int64_t b) const { return bytes_text(b); }

  // Note [Layouts]: the choice's tp x pp x dp and whether a trial's ranks can train the model so.
  Layout layout_of(const Choice& c) const {
    Layout L;
    L.tp = layout_degree(c, user.base, "tensor_parallel.autotp_size");
    L.pp = layout_degree(c, user.base, "pipeline.stages");
    L.dp = data_parallel_ranks(c, user.base, in.world);
    L.rules = rules;
    const std::string tp = "tensor_parallel.autotp_size " + std::to_string(L.tp);
    const std::string pp = "pipeline.stages " + std::to_string(L.pp);
    const ModelConfig& m = in.model;
    if (L.dp == 0) {
      L.problem = tp + " x " + pp + " = " + std::to_string(L.tp * L.pp) + " does not divide the " +
                  std::to_string(in.world) + " ranks of a trial (the ranks form tp x pp x dp)";
      return L;
    }
    const json* v = find_path(user.base, "dscpp.pipeline.virtual_stages");
    const int64_t chunks = L.pp * (v && v->is_number_integer() ? v->get<int64_t>() : 1);
    if (chunks > m.n_layer) {
      L.problem = pp + (chunks > L.pp ? " x dscpp.pipeline.virtual_stages " + std::to_string(chunks / L.pp) : "") +
                  " exceeds the model's " + std::to_string(m.n_layer) + " layers: every pipeline stage needs one";
      return L;
    }
    for (const auto& [what, n] : {std::pair<const char*, int64_t>{"attention heads", m.n_head},
                                  {"KV heads", m.n_kv_head}, {"MLP width", m.n_ffn}})
      if (n % L.tp != 0) {
        L.problem = tp + " does not divide the model's " + std::to_string(n) + " " + what;
        return L;
      }
    auto fh = c.find("dscpp.fused_head");
    const json* fused = fh != c.end() ? &fh->second : find_path(user.base, "dscpp.fused_head");
    if (L.tp > 1 && fused && *fused == true) {
      L.problem = "dscpp.fused_head true with " + tp + ": the fused head does not split the vocabulary";
      return L;
    }
    for (const char* off : {"zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device"}) {
      auto it = c.find(off);
      const json* d = it != c.end() ? &it->second : find_path(user.base, off);
      if (L.tp * L.pp > 1 && d && d->is_string() && *d != "none") {  // Engine::init_model_parallel refuses it
        L.problem = std::string(off) + " " + d->get<std::string>() + " with " + tp + " x " + pp +
                    ": offload under tensor or pipeline parallelism is not supported yet";
        return L;
      }
    }
    try {
      L.rules = batch_rules(in.user_config, in.at, L.dp);
    } catch (const ConfigError& err) {
      L.problem = tp + " x " + pp + " leaves " + std::to_string(L.dp) + " data-parallel rank(s): " + err.what();
    }
    return L;
  }

  Planned plan(int stage, const Choice& c, int64_t m, const std::string& space,
               const std::vector<std::string>& tuned) const {
    Planned p;
    Experiment& e = p.exp;
    const Layout L = layout_of(c);
    e.stage = stage;
    e.micro_batch = m;
    e.gas = L.rules.gas_for(m);
    e.choice = c;
    e.space = space;
    e.name = experiment_name(stage, c, tuned, e.gas, m);
    e.ds_config = make_config(user, stage, c, m, e.gas, L.dp ? L.dp : in.world);
    if (!L.problem.empty()) {
      p.layout = L.problem;
      return p;
    }
    if (!L.rules.allowed(m)) {
      p.error = "micro-batch " + std::to_string(m) + " is outside the batch rules (" + L.rules.describe() + ")";
      return p;
    }
    try {
      const DeepSpeedConfig cfg = DeepSpeedConfig::parse(e.ds_config, in.world);
      const TrainingMemoryEstimate est = cfg.tp_size() * cfg.pp_size() > 1
                                             ? estimate_layout_memory(in.model, cfg, in.seq_len, in.cuda)
                                             : estimate_training_memory(in.model, cfg, in.seq_len, in.cuda);
      e.predicted_peak = est.peak_bytes;
      e.peak_at = est.peak_at;
      p.canon = cfg.canonical_dump();
    } catch (const ConfigError& err) {
      p.error = err.what();
    }
    return p;
  }

  std::string over_limit(const Planned& p) const {
    return "micro-batch " + std::to_string(p.exp.micro_batch) + ": predicted peak " + gib(p.exp.predicted_peak) +
           " (" + p.exp.peak_at + ") > limit " + gib(in.memory_limit) + " (" + in.memory_limit_why + ")";
  }

  Fit fit(int stage, const Choice& c) const {
    Fit f;
    const Layout L = layout_of(c);
    if (!L.problem.empty()) {
      f.layout = L.problem;
      return f;
    }
    auto fits = [&](int64_t m) {
      const Planned p = plan(stage, c, m, "", {});
      return p.error.empty() && p.exp.predicted_peak <= in.memory_limit;
    };
    f.mbs = largest_fitting(L.rules, fits);
    const std::vector<int64_t> allowed = L.rules.allowed_list();
    if (f.mbs == 0) {
      const Planned p = plan(stage, c, allowed[0], "", {});
      if (!p.error.empty()) f.error = p.error;
      else f.why = "no micro-batch fits: at " + over_limit(p);
      return f;
    }
    const auto next = std::upper_bound(allowed.begin(), allowed.end(), f.mbs);
    const Planned at = plan(stage, c, f.mbs, "", {});
    f.why = "largest micro-batch that fits: " + std::to_string(f.mbs) + " (predicted " + gib(at.exp.predicted_peak) + ")";
    if (next == allowed.end()) f.why += ", the largest the batch rules allow";
    else if (const Planned n = plan(stage, c, *next, "", {}); n.error.empty()) f.why += "; " + over_limit(n);
    return f;
  }

  size_t add(Record r) {
    res.records.push_back(std::move(r));
    return res.records.size() - 1;
  }

  std::optional<double> score_of(size_t rec) const {
    const Record& r = res.records[rec];
    if (r.state != Record::State::ran || !r.result->metrics) return std::nullopt;
    return metric_score(*r.result->metrics, in.at.metric);
  }

  // Records the batch, running what has not run yet (at once, on the slots); each one's score, nullopt when it
  // failed or did not run. Records come in the batch's order.
  std::vector<std::optional<double>> run(const std::vector<Planned>& batch) {
    std::vector<Experiment> to_run;
    std::vector<int> slot(batch.size(), -1);  // index into to_run
    std::map<std::string, size_t> pending;    // canonical config -> its batch position
    for (size_t i = 0; i < batch.size(); i++) {
      const Planned& p = batch[i];
      if (!p.error.empty() || !p.layout.empty() || seen.count(p.canon) || pending.count(p.canon) ||
          p.exp.predicted_peak > in.memory_limit)
        continue;
      pending[p.canon] = i;
      slot[i] = int(to_run.size());
      to_run.push_back(p.exp);
    }
    const std::vector<TrialResult> results = to_run.empty() ? std::vector<TrialResult>{} : runner.run(to_run);
    std::vector<std::optional<double>> scores;
    for (size_t i = 0; i < batch.size(); i++) {
      const Planned& p = batch[i];
      Record r{p.exp, Record::State::ran, std::nullopt, ""};
      std::optional<size_t> same;
      if (!p.layout.empty()) {
        r.state = Record::State::layout;
        r.note = p.layout;
      } else if (!p.error.empty()) {
        r.state = Record::State::invalid;
        r.note = p.error;
      } else if (slot[i] >= 0) {
        r.result = results[size_t(slot[i])];
        res.trials_run += !r.result->reused;
        res.trials_reused += r.result->reused;
      } else if (auto s = seen.find(p.canon); s != seen.end()) {
        same = s->second;
      } else if (auto q = pending.find(p.canon); q != pending.end() && q->second != i) {
        same = seen.at(p.canon);  // ran earlier in this batch: recorded above
      } else {
        r.state = Record::State::pruned;
        r.note = over_limit(p);
      }
      if (same) {
        r.state = Record::State::duplicate;
        r.note = "the same run as " + res.records[*same].exp.name + " (Note [Inert keys])";
      }
      const size_t id = add(r);
      if (r.state == Record::State::ran || r.state == Record::State::pruned) seen[p.canon] = id;
      scores.push_back(same ? score_of(*same) : score_of(id));
    }
    return scores;
  }

  std::optional<size_t> best_in(const std::string& space) const {
    std::optional<size_t> best;
    for (size_t i = 0; i < res.records.size(); i++) {
      if (res.records[i].exp.space != space) continue;
      const std::optional<double> s = score_of(i);
      if (s && (!best || *s > *score_of(*best))) best = i;
    }
    return best;
  }

  // The micro-batch search of a stage (DeepSpeed's run_tuning_micro_batch_sizes); returns the stage's best record.
  std::optional<size_t> micro_batch_search(int stage, const Choice& c, int64_t most, StageReport& sr) {
    const std::string space = "z" + std::to_string(stage);
    const bool listed = !user.micro_batches.empty();
    const std::vector<int64_t> list =
        listed ? user.micro_batches : tuning_micro_batch_sizes(rules, most, in.at.num_tuning_micro_batch_sizes);
    std::vector<Planned> batch;
    for (int64_t m : list) batch.push_back(plan(stage, c, m, space, {}));
    std::string names;
    for (int64_t m : list) names += (names.empty() ? "" : ", ") + std::to_string(m);
    sr.notes.push_back("micro-batch search over " + names + (listed ? " (listed in the config)" : ""));
    log << "stage " << stage << ": micro-batch search over " << names << std::endl;
    run(batch);
    if (!listed) {
      std::optional<size_t> top;
      for (size_t i = 0; i < res.records.size(); i++)
        if (res.records[i].exp.space == space && res.records[i].exp.micro_batch == most) top = i;
      double best = top && score_of(*top) ? *score_of(*top) : 0.0;
      for (int64_t m : refinement_micro_batches(rules, list)) {
        const std::optional<double> s = run({plan(stage, c, m, space, {})})[0];
        if (!s || *s <= best * (1 + kMetricPercentDiff)) break;
        best = *s;
      }
    }
    return best_in(space);
  }

  std::vector<double> features(const Experiment& e, const std::vector<Dimension>& dims) const {
    std::vector<double> f = {double(e.stage), std::log2(double(e.micro_batch)), std::log2(double(e.gas)),
                             double(e.predicted_peak) / double(std::max<int64_t>(1, in.memory_limit))};
    for (const Dimension& d : dims) {
      auto it = e.choice.find(d.path);
      const json v = it == e.choice.end() ? json(nullptr) : it->second;
      if (v.is_boolean()) f.push_back(v.get<bool>() ? 1 : 0);
      else if (v.is_number()) f.push_back(std::log2(1 + v.get<double>()));
      else if (v.is_string()) f.push_back(double(std::find(d.values.begin(), d.values.end(), v) - d.values.begin()));
      else f.push_back(0);
    }
    return f;
  }

  // A stage's space through the tuner (DeepSpeed's tune_space after the micro-batch search).
  void space_search(int stage, StageReport& sr) {
    const std::vector<Dimension> dims = stage_dimensions(stage, user, ctx);
    std::vector<std::string> tuned;
    for (const auto& d : dims)
      if (d.values.size() > 1) tuned.push_back(d.path);
    const std::string space = "z" + std::to_string(stage) + "_space";
    std::vector<Planned> cands;
    std::vector<std::vector<double>> feats;
    std::map<std::string, bool> choices_done, canon_done;
    std::set<std::string> layouts_done;  // a layout the ranks cannot hold is that whatever the other keys
    int duplicates = 0, pruned = 0, layouts = 0, invalid = 0, elsewhere = 0;
    const std::vector<Choice> choices = all_choices(dims);
    for (Choice c : choices) {
      std::vector<std::string> why;
      const int eff = canonical_choice(stage, c, user.base, ctx, &why);
      std::string merged;
      for (const auto& w : why) merged += (merged.empty() ? "" : "; ") + w;
      if (eff != stage || choices_done.count(json(c).dump())) {
        res.collapsed[merged]++;
        elsewhere += eff != stage;
        continue;
      }
      choices_done[json(c).dump()] = true;
      const Fit f = fit(stage, c);
      const BatchRules& rules_c = layout_of(c).rules;
      if (!f.layout.empty() && !layouts_done.insert(f.layout).second) continue;  // one record per layout and reason
      if (!f.layout.empty() || !f.error.empty() || f.mbs == 0) {
        const Planned p = plan(stage, c, rules_c.allowed_list()[0], space, tuned);
        run({p});  // recorded as pruned or invalid, never launched
        (!f.layout.empty() ? layouts : f.error.empty() ? pruned : invalid)++;
        continue;
      }
      const std::vector<int64_t> list = !user.micro_batches.empty()
                                            ? user.micro_batches
                                            : tuning_micro_batch_sizes(rules_c, f.mbs, in.at.num_tuning_micro_batch_sizes);
      for (int64_t m : list) {
        Planned p = plan(stage, c, m, space, tuned);
        if (p.error.empty() && p.exp.predicted_peak <= in.memory_limit && !seen.count(p.canon) &&
            !canon_done.count(p.canon)) {
          canon_done[p.canon] = true;
          feats.push_back(features(p.exp, dims));
          cands.push_back(std::move(p));
          continue;
        }
        run({p});  // a duplicate of a trial that ran, pruned or invalid: recorded, not a tuner candidate
        duplicates += res.records.back().state == Record::State::duplicate;
        pruned += res.records.back().state == Record::State::pruned;
        layouts += res.records.back().state == Record::State::layout;
        invalid += res.records.back().state == Record::State::invalid;
      }
    }
    if (elsewhere == int(choices.size())) {
      sr.notes.push_back("its space's " + std::to_string(choices.size()) + " points all run at another stage (one "
                         "rank: Note [Inert keys])");
      return;
    }
    std::string keys;
    for (const auto& t : tuned) keys += (keys.empty() ? "" : ", ") + t;
    log << "stage " << stage << ": space of " << (keys.empty() ? "no key" : keys) << ": " << cands.size()
        << " candidates for the " << in.at.tuner_type << " tuner" << std::endl;
    std::unique_ptr<Tuner> tuner = make_tuner(in.at.tuner_type, feats, in.seed);
    // The stage's micro-batch search ran points of this space (the first choice at each micro-batch): the tuner
    // learns from them and must beat their best.
    std::optional<double> prior_best;
    int priors = 0;
    for (size_t i = 0; i < res.records.size(); i++) {
      const Record& r = res.records[i];
      if (r.exp.stage != stage || r.state != Record::State::ran) continue;
      const std::optional<double> s = score_of(i);
      tuner->prior(features(r.exp, dims), s);
      priors++;
      if (s && (!prior_best || *s > *prior_best)) prior_best = s;
    }
    const TuneStats st = autotune::tune(
        *tuner, size_t(std::max(1, parallel)), size_t(in.at.tuner_num_trials), size_t(in.at.tuner_early_stopping),
        [&](const std::vector<size_t>& idx) {
          std::vector<Planned> b;
          for (size_t i : idx) b.push_back(cands[i]);
          return run(b);
        },
        prior_best);
    std::string line = "space (" + (keys.empty() ? std::string("no key left to tune") : keys) + "): " +
                       std::to_string(cands.size()) + " candidates, " + std::to_string(st.trials) + " run by the " +
                       in.at.tuner_type + " tuner";
    if (st.early_stopped)
      line += ", stopped early after " + std::to_string(st.trials) + " (tuner_early_stopping " +
              std::to_string(in.at.tuner_early_stopping) + " trials without a better one)";
    else if (st.trials < cands.size())
      line += " (tuner_num_trials " + std::to_string(in.at.tuner_num_trials) + ")";
    if (duplicates) line += "; " + std::to_string(duplicates) + " equal to trials already run";
    if (pruned) line += "; " + std::to_string(pruned) + " pruned by memory";
    if (layouts) line += "; " + std::to_string(layouts) + " pruned by layout";
    if (invalid) line += "; " + std::to_string(invalid) + " invalid configs";
    if (priors && in.at.tuner_type == "model_based")
      line += "; its cost model started from the micro-batch search's " + std::to_string(priors) + " trials";
    sr.notes.push_back(line);
  }

  AutotuneResult tune() {
    const auto t0 = std::chrono::steady_clock::now();
    res.batch_rules = rules.describe();
    const Choice first = first_choice(user);
    int64_t prev_max_mbs = 0, prev_best_mbs = 0;
    double prev_best_score = 0;
    for (int stage : user.stages) {
      StageReport sr;
      sr.stage = stage;
      Choice c = first;
      std::vector<std::string> why;
      const bool equivalent = canonical_choice(stage, c, user.base, ctx, &why) != stage;
      std::optional<size_t> stage_best;
      bool tune_space = !in.at.fast;
      if (equivalent) {
        sr.status = "equivalent";
        sr.notes.push_back(why.front() + ": its micro-batch search would repeat that stage's");
      } else {
        const Fit f = fit(stage, c);
        sr.largest_micro_batch = f.mbs;
        if (!f.layout.empty() || !f.error.empty()) {  // recorded as pruned by layout or invalid, never launched
          sr.status = f.layout.empty() ? "invalid" : "pruned";
          sr.notes.push_back(f.layout.empty() ? f.error : f.layout);
          run({plan(stage, c, rules.allowed_list()[0], "z" + std::to_string(stage), {})});
          res.stages.push_back(sr);
          continue;
        }
        sr.notes.push_back(f.why);
        log << "stage " << stage << ": " << f.why << std::endl;
        if (f.mbs == 0) {
          sr.status = "pruned";
          run({plan(stage, c, rules.allowed_list()[0], "z" + std::to_string(stage), {})});
          res.stages.push_back(sr);
          continue;
        }
        if (f.mbs < prev_max_mbs) {
          sr.status = "skipped";
          sr.notes.push_back("its largest micro-batch (" + std::to_string(f.mbs) + ") is below the previous stage's (" +
                             std::to_string(prev_max_mbs) + "): DeepSpeed's rule skips a stage that buys no larger "
                             "batch");
          res.stages.push_back(sr);
          continue;
        }
        stage_best = micro_batch_search(stage, c, f.mbs, sr);
        const int64_t best_mbs = stage_best ? res.records[*stage_best].exp.micro_batch : 0;
        const double best_score = stage_best ? *score_of(*stage_best) : 0.0;
        if (tune_space && stage > 0 && (best_mbs <= prev_best_mbs || best_score < prev_best_score)) {
          tune_space = false;
          sr.notes.push_back("space not tuned: its best micro-batch (" + std::to_string(best_mbs) + ") and metric do "
                             "not beat the previous stage's (" + std::to_string(prev_best_mbs) + "), DeepSpeed's rule");
        }
        if (best_mbs > prev_best_mbs) {
          prev_best_mbs = best_mbs;
          prev_max_mbs = f.mbs;
          prev_best_score = best_score;
        }
      }
      if (tune_space) space_search(stage, sr);
      for (size_t i = 0; i < res.records.size(); i++)
        if (res.records[i].exp.stage == stage && score_of(i) && (!sr.best || *score_of(i) > *score_of(*sr.best)))
          sr.best = i;
      const bool ran = std::any_of(res.records.begin(), res.records.end(), [&](const Record& r) {
        return r.exp.stage == stage && r.state == Record::State::ran;
      });
      if (sr.status.empty() || (sr.status == "equivalent" && sr.best)) sr.status = ran && !sr.best ? "failed" : "tuned";
      res.stages.push_back(sr);
    }
    for (size_t i = 0; i < res.records.size(); i++)
      if (score_of(i) && (!res.best || *score_of(i) > *score_of(*res.best))) res.best = i;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  }
};

Autotuner::Autotuner(AutotuneInputs inputs, TrialRunner& runner, int parallel, std::ostream& log)
    : in_(std::move(inputs)), runner_(runner), parallel_(parallel), log_(log) {}

AutotuneResult Autotuner::tune() {
  DSCPP_CHECK(in_.world >= 1 && in_.seq_len >= 1 && in_.memory_limit > 0, "autotune: world ", in_.world,
              ", seq_len ", in_.seq_len, ", memory limit ", in_.memory_limit, " bytes: each must be > 0");
  Impl impl(in_, runner_, parallel_, log_);
  return impl.tune();
}

}  // namespace dscpp::autotune
