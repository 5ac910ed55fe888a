// Universal checkpoints: synthetic ZeRO tags written here exactly per the layout contract (/work/notes/zero_layout.md)
// for world sizes 1, 2, 4 and stages 0-3, from one random "global" f32 state per parameter; each is converted to a
// universal tag, which must give back, for every (world size, stage, rank) target with its own unit padding, the
// global state's slices bit for bit (padding 0). Also: the direct read of a sharded tag, the named resharding error,
// and the CLI (dscpp ckpt to-universal / inspect).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "dscpp/checkpoint/universal.h"

namespace fs = std::filesystem;
using namespace dscpp;

namespace {

const char* kTag = "global_step7";

// A tiny model's flat buffer: parameters aligned to 4 elements inside a unit (gaps), units padded to unit_pad.
struct Synth {
  FlatLayout layout;
  std::vector<FlatRange> units;
  std::map<std::string, Shape> shapes;
  int64_t flat_numel = 0;
};

Synth make_layout(int64_t unit_pad) {
  const std::vector<std::vector<std::pair<std::string, Shape>>> units = {
      {{"wte.weight", {9, 6}}},
      {{"h.0.w", {5, 7}}, {"h.0.b", {5}}},
      {{"h.1.w", {5, 7}}, {"h.1.b", {5}}, {"h.1.g", {3}}},
      {{"norm.weight", {6}}, {"lm_head.weight", {4, 6}}},
  };
  Synth s;
  int64_t pos = 0;
  for (const auto& u : units) {
    const int64_t begin = pos;
    for (const auto& [name, shape] : u) {
      pos = (pos + 3) / 4 * 4;
      s.layout.push_back({name, pos, shape_numel(shape)});
      s.shapes[name] = shape;
      pos += shape_numel(shape);
    }
    pos = (pos + unit_pad - 1) / unit_pad * unit_pad;
    s.units.push_back({begin, pos});
  }
  s.flat_numel = pos;
  return s;
}

int64_t unit_pad(int world, int stage) { return stage > 0 ? 16 * world : 16; }

ZeroPartition partition(const Synth& s, int stage, int world, int rank) {
  return stage > 0 ? ZeroPartition(stage, world, rank, s.units) : ZeroPartition(0, world, rank, {{0, s.flat_numel}});
}

// The global state: random, never 0, the same for a parameter whatever the layout.
std::vector<float> global_state(const std::string& param, const std::string& state, int64_t n) {
  std::mt19937 g(uint32_t(std::hash<std::string>{}(param + "/" + state)));
  std::uniform_real_distribution<float> mag(0.25f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = (g() & 1 ? 1.0f : -1.0f) * mag(g);
  return v;
}

std::vector<float> flat_state(const Synth& s, const std::string& state) {
  std::vector<float> f(size_t(s.flat_numel), 0.0f);
  for (const auto& p : s.layout) {
    auto v = global_state(p.name, state, p.numel);
    std::copy(v.begin(), v.end(), f.begin() + p.offset);
  }
  return f;
}

// What rank `rank` of p must hold: its owned ranges of the flat buffer, in unit order.
std::vector<float> expected_shard(const Synth& s, const ZeroPartition& p, int rank, const std::string& state) {
  std::vector<float> f = flat_state(s, state), out;
  for (const FlatRange& r : p.owned(rank)) out.insert(out.end(), f.begin() + r.begin, f.begin() + r.end);
  return out;
}

Tensor from_vector(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

void expect_bitwise(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::f32) << what;
  ASSERT_EQ(got.numel(), int64_t(want.size())) << what;
  const float* g = got.data<float>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); i++)
    if (std::memcmp(&g[i], &want[i], 4) != 0 && bad++ == 0) first = int64_t(i);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ; first at " << first << ": got "
                    << (first >= 0 ? g[first] : 0.f) << ", want " << (first >= 0 ? want[size_t(first)] : 0.f);
}

struct SourceOpts {
  bool mixed = false;          // bf16 model_states (+ fp32_master at stage 0), else f32 model_states
  bool model_states = true;    // stage 3 may save none
  bool sgd = false;            // momentum_buffer instead of exp_avg / exp_avg_sq
  int skip_rank = -1;          // leave out this rank's shard file (a broken checkpoint)
};

std::vector<std::string> opt_states(bool sgd) {
  return sgd ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
}

// A sharded tag exactly as the contract says the ZeRO engine writes it.
void write_source(const std::string& dir, int world, int stage, const SourceOpts& o = {}) {
  const Synth s = make_layout(unit_pad(world, stage));
  const ZeroPartition part = partition(s, stage, world, 0);
  CheckpointWriter w(dir, kTag);
  if (o.model_states) {
    NamedTensors ps;
    for (const auto& p : s.layout) {
      Tensor t = from_vector(global_state(p.name, "fp32", p.numel), s.shapes.at(p.name));
      ps.emplace_back(p.name, o.mixed ? t.to(DType::bf16) : t);
    }
    w.add_tensors("model_states.safetensors", ps, {{"format", "dscpp"}});
  }
  std::vector<std::string> states = opt_states(o.sgd);
  if (stage == 0) {
    NamedTensors ts;
    for (const auto& st : states) ts.emplace_back(st, from_vector(flat_state(s, st), {s.flat_numel}));
    if (o.mixed) ts.emplace_back("fp32_master", from_vector(flat_state(s, "fp32"), {s.flat_numel}));
    w.add_tensors("optim_states.safetensors", ts, {{"optimizer", o.sgd ? "sgd" : "adamw"}});
  } else {
    states.insert(states.begin(), "fp32");
    for (int r = 0; r < world; r++) {
      if (r == o.skip_rank) continue;
      NamedTensors ts;
      for (const auto& st : states) {
        auto v = expected_shard(s, part, r, st);
        ts.emplace_back(st, from_vector(v, {int64_t(v.size())}));
      }
      w.add_tensors("zero/rank_" + std::to_string(r) + ".safetensors", ts);
    }
  }
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : s.layout) params.push_back({p.name, p.offset, p.numel});
  nlohmann::json st = {{"global_steps", 7},
                       {"optimizer", {{"type", o.sgd ? "sgd" : "adamw"}, {"step", 7}}},
                       {"precision", o.mixed ? "bf16" : "f32"},
                       {"layout", {{"flat_numel", s.flat_numel}, {"params", params}}},
                       {"dp_world_size", world},
                       {"client_state", {{"epoch", 1}}}};
  if (stage > 0 || world > 1) st["zero"] = part.to_json();  // a W=1 stage-0 tag looks like today's engine's
  w.add_json("engine_state.json", st);
  w.add_json("tokenizer.json", {{"model", {{"type", "BPE"}}}});
  w.commit();
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Loads `r` into every (world size, stage, rank) target and compares with the global state.
void check_all_targets(const CheckpointReader& r, bool sgd, const std::string& what) {
  for (int tw : {1, 2, 4})
    for (int ts = 0; ts <= 3; ts++) {
      const Synth t = make_layout(unit_pad(tw, ts));
      for (int rank = 0; rank < tw; rank++) {
        const ZeroPartition tp = partition(t, ts, tw, rank);
        auto got = read_owned_states(r, tp, t.layout);
        std::vector<std::string> want = opt_states(sgd);
        want.push_back("fp32");
        ASSERT_EQ(got.size(), want.size()) << what;
        for (const auto& st : want) {
          ASSERT_TRUE(got.count(st)) << what << ": no state " << st;
          expect_bitwise(got.at(st), expected_shard(t, tp, rank, st),
                         what + " -> W=" + std::to_string(tw) + " stage " + std::to_string(ts) + " rank " +
                             std::to_string(rank) + " " + st);
        }
      }
    }
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("dscpp_universal_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

}  // namespace

TEST(Universal, ConvertEverySourceThenLoadIntoEveryPartition) {
  TempDir tmp("convert");
  for (int world : {1, 2, 4})
    for (int stage = 0; stage <= 3; stage++) {
      SourceOpts o;
      o.mixed = (world + stage) % 2 == 1;
      o.model_states = stage < 3 || world == 4;
      const std::string what = "source W=" + std::to_string(world) + " stage " + std::to_string(stage);
      const std::string src = tmp / ("src_" + std::to_string(world) + "_" + std::to_string(stage));
      const std::string out = tmp / ("uni_" + std::to_string(world) + "_" + std::to_string(stage));
      write_source(src, world, stage, o);
      UniversalResult res = convert_to_universal(src, "", out, "");
      EXPECT_EQ(res.out_tag, std::string(kTag) + "_universal");
      EXPECT_EQ(res.source_stage, stage);
      EXPECT_EQ(res.source_world_size, world);
      EXPECT_EQ(res.num_params, 8);
      EXPECT_EQ(res.states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"})) << what;
      EXPECT_TRUE(res.latest_updated);
      EXPECT_EQ(read_latest_tag(out), res.out_tag);
      EXPECT_EQ(read_latest_universal_tag(out), res.out_tag);

      // The universal tag itself: each parameter's global state, in its shape (1-D when no file gives the shape).
      CheckpointReader ur(out);
      const Synth s = make_layout(unit_pad(world, stage));
      for (const auto& p : s.layout) {
        auto ts = ur.read_tensors("universal/" + p.name + ".safetensors");
        ASSERT_EQ(ts.size(), 3u) << what << " " << p.name;
        for (const char* st : {"fp32", "exp_avg", "exp_avg_sq"}) {
          EXPECT_EQ(ts.at(st).shape(), o.model_states ? s.shapes.at(p.name) : Shape{p.numel}) << what << " " << p.name;
          expect_bitwise(ts.at(st), global_state(p.name, st, p.numel), what + " universal " + p.name + " " + st);
        }
      }
      nlohmann::json est = ur.read_json("engine_state.json");
      EXPECT_TRUE(est.at("universal").get<bool>());
      EXPECT_FALSE(est.contains("zero"));
      EXPECT_EQ(est.at("optimizer"), nlohmann::json({{"type", "adamw"}, {"step", 7}}));
      EXPECT_EQ(est.at("client_state"), nlohmann::json({{"epoch", 1}}));
      EXPECT_FALSE(ur.has_file("optim_states.safetensors"));
      for (const auto& f : ur.files()) EXPECT_FALSE(f.name.starts_with("zero/")) << f.name;
      EXPECT_EQ(ur.read_json("tokenizer.json"), nlohmann::json({{"model", {{"type", "BPE"}}}}));
      EXPECT_EQ(ur.has_file("model_states.safetensors"), o.model_states);
      if (o.model_states) {
        EXPECT_EQ(file_bytes(ur.dir() + "/model_states.safetensors"),
                  file_bytes(src + "/" + kTag + "/model_states.safetensors")) << what;
      }

      check_all_targets(ur, false, what);
    }
}

TEST(Universal, ShardedTagLoadsDirectlyAtItsOwnWorldSize) {
  TempDir tmp("direct");
  for (int world : {1, 2, 4})
    for (int stage = 0; stage <= 3; stage++) {
      const std::string src = tmp / ("src_" + std::to_string(world) + "_" + std::to_string(stage));
      write_source(src, world, stage, {.mixed = world == 2});
      CheckpointReader r(src);
      const Synth s = make_layout(unit_pad(world, stage));
      for (int rank = 0; rank < world; rank++) {
        const ZeroPartition p = partition(s, stage, world, rank);
        auto a = read_owned_states(r, p, s.layout);
        auto b = read_owned_states(r, p);  // the saved layout
        for (const char* st : {"fp32", "exp_avg", "exp_avg_sq"}) {
          const std::string what = "W=" + std::to_string(world) + " stage " + std::to_string(stage) + " rank " +
                                   std::to_string(rank) + " " + st;
          expect_bitwise(a.at(st), expected_shard(s, p, rank, st), what);
          expect_bitwise(b.at(st), expected_shard(s, p, rank, st), what + " (saved layout)");
        }
      }
    }
  // Stage 0 is not partitioned: any stage-0 run reads it, whatever its world size.
  const std::string src = tmp / "src_2_0";
  const Synth s = make_layout(16);
  for (int tw : {1, 4}) {
    const ZeroPartition p = partition(s, 0, tw, tw - 1);
    expect_bitwise(read_owned_states(CheckpointReader(src), p, s.layout).at("exp_avg_sq"),
                   expected_shard(s, p, tw - 1, "exp_avg_sq"), "stage 0 W=2 -> W=" + std::to_string(tw));
  }
}

// Any sharded or flat tag loads into any world size, stage and unit padding directly, resharding as it reads
// (the universal conversion is only for those who want one file per parameter).
TEST(Universal, ShardedTagsReshardAsTheyRead) {
  TempDir tmp("reshard");
  for (auto [world, stage] : {std::pair{2, 2}, {2, 0}, {4, 3}}) {
    const std::string src = tmp / ("w" + std::to_string(world) + "s" + std::to_string(stage));
    write_source(src, world, stage, {.mixed = stage == 0});
    check_all_targets(CheckpointReader(src), false,
                      "direct W=" + std::to_string(world) + " stage " + std::to_string(stage));
  }
}

TEST(Universal, SgdStatesBrokenSourcesAndModelMismatch) {
  TempDir tmp("errors");
  write_source(tmp / "sgd", 4, 3, {.sgd = true});
  UniversalResult res = convert_to_universal(tmp / "sgd", kTag, "", "");
  EXPECT_EQ(res.states, (std::vector<std::string>{"fp32", "momentum_buffer"}));
  EXPECT_FALSE(res.latest_updated);  // in place: `latest` still names the source
  EXPECT_EQ(read_latest_tag(tmp / "sgd"), kTag);
  EXPECT_EQ(read_latest_universal_tag(tmp / "sgd"), std::string(kTag) + "_universal");
  check_all_targets(CheckpointReader(tmp / "sgd", res.out_tag), true, "sgd W=4 stage 3");

  // Converting a universal tag, or onto the source tag, is refused.
  try {
    convert_to_universal(tmp / "sgd", res.out_tag, "", "again");
    ADD_FAILURE() << "converted a universal tag";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind, CheckpointErrorKind::bad_argument) << e.what();
  }
  EXPECT_THROW(convert_to_universal(tmp / "sgd", kTag, tmp / "sgd", kTag), CheckpointError);

  // A shard file missing from the tag is named.
  write_source(tmp / "broken", 2, 1, {.skip_rank = 1});
  try {
    convert_to_universal(tmp / "broken", "", "", "");
    ADD_FAILURE() << "converted a tag without zero/rank_1";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind, CheckpointErrorKind::missing_file) << e.what();
    EXPECT_NE(std::string(e.what()).find("zero/rank_1.safetensors"), std::string::npos) << e.what();
  }

  // A model whose parameters differ from the checkpoint's.
  const CheckpointReader ur(tmp / "sgd", res.out_tag);
  Synth t = make_layout(32);
  t.layout[2].name = "h.0.bias";
  try {
    read_owned_states(ur, ZeroPartition(1, 2, 0, t.units), t.layout);
    ADD_FAILURE() << "loaded into a model with another parameter";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind, CheckpointErrorKind::mismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find("h.0.bias"), std::string::npos) << e.what();
  }
}

namespace {
std::string dscpp_binary() { return DSCPP_BINARY_DIR "/dscpp"; }  // one literal: see e2e/cli_workspace.h

int run_cli(const std::string& args, std::string* out) {
  FILE* f = popen((dscpp_binary() + " " + args + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

TEST(Universal, CliToUniversalAndInspect) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  TempDir tmp("cli");
  const std::string dir = tmp / "ckpt";
  write_source(dir, 2, 2);

  std::string out;
  ASSERT_EQ(run_cli("ckpt inspect " + dir, &out), 0) << out;
  for (const char* s : {"ZeRO stage 2", "world size 2", "zero/rank_0.safetensors", "zero/rank_1.safetensors"})
    EXPECT_NE(out.find(s), std::string::npos) << s << " not in:\n" << out;

  out.clear();
  ASSERT_EQ(run_cli("ckpt to-universal " + dir, &out), 0) << out;
  EXPECT_NE(out.find("global_step7_universal"), std::string::npos) << out;
  EXPECT_EQ(read_latest_tag(dir), kTag);
  EXPECT_EQ(read_latest_universal_tag(dir), std::string(kTag) + "_universal");
  check_all_targets(CheckpointReader(dir, std::string(kTag) + "_universal"), false, "CLI, same dir");

  out.clear();
  ASSERT_EQ(run_cli("ckpt inspect " + dir + " --tag global_step7_universal", &out), 0) << out;
  EXPECT_NE(out.find("universal: yes"), std::string::npos) << out;
  EXPECT_NE(out.find("latest_universal: global_step7_universal"), std::string::npos) << out;

  out.clear();
  const std::string other = tmp / "resharded";
  ASSERT_EQ(run_cli("ckpt to-universal " + dir + " --tag " + kTag + " --output " + other + " --output-tag u7", &out), 0)
      << out;
  EXPECT_EQ(read_latest_tag(other), "u7");
  EXPECT_EQ(read_latest_universal_tag(other), "u7");

  out.clear();
  EXPECT_NE(run_cli("ckpt to-universal " + dir + " --tag global_step7_universal", &out), 0) << out;
  EXPECT_NE(out.find("already a universal checkpoint"), std::string::npos) << out;

  out.clear();
  ASSERT_EQ(run_cli("ckpt to-universal --help", &out), 0) << out;
  EXPECT_NE(out.find("--output-tag"), std::string::npos) << out;
}
