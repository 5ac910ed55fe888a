// dscpp ckpt: look into and convert checkpoints.
//   inspect    tags, `latest`, leftovers of interrupted saves, every file's size and CRC32 status, model config,
//              counters, optimizer/scheduler
//   export     an engine checkpoint tag -> a Hugging Face folder (DeepSpeed's zero_to_fp32 equivalent)
//   to-universal  a ZeRO tag -> a universal tag, loadable at any world size and stage (DeepSpeed's ds_to_universal)
//   hf-logits  logits of a Hugging Face folder loaded into our model (to compare with transformers)
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/crc32.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/universal.h"

namespace fs = std::filesystem;

namespace dscpp::cli {

namespace {
struct CkptOptions {
  std::string dir, tag, out, out_tag, format = "safetensors", dtype = "f32", max_shard = "5GB", tokens = "0,1,2,3";
};

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = double(b);
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, u++;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f(path);
  DSCPP_CHECK(f.good(), path, ": cannot open");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    DSCPP_FAIL(path, ": invalid JSON: ", e.what());
  }
}

// One manifest entry checked against the disk: "ok", or what is wrong. Never throws for a bad file.
std::string file_status(const std::string& path, uint64_t bytes, uint32_t crc) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "MISSING";
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return "UNREADABLE (" + ec.message() + ")";
  if (size != bytes) return "SIZE " + std::to_string(size) + " != manifest " + std::to_string(bytes);
  try {
    const uint32_t got = file_crc32(path);
    if (got != crc) {
      char buf[80];
      std::snprintf(buf, sizeof buf, "CRC32 %08x != manifest %08x (corrupted)", got, crc);
      return buf;
    }
  } catch (const std::exception& e) {
    return std::string("UNREADABLE (") + e.what() + ")";
  }
  return "ok";
}

void print_tensors(const std::string& label, const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, int64_t> by_dtype;
  uint64_t bytes = 0;
  for (const auto& e : f.entries()) {
    by_dtype[dtype_name(e.dtype)] += shape_numel(e.shape);
    bytes += e.end - e.begin;
  }
  std::printf("%s: %zu tensors, %s", label.c_str(), f.entries().size(), human_bytes(bytes).c_str());
  for (const auto& [d, n] : by_dtype) std::printf(", %" PRId64 " x %s", n, d.c_str());
  std::printf("\n");
}

// ZeRO partitioning (stage, world size, per-rank shard files) or the universal layout, when the tag (or, with
// `part`, one model-parallel part's folder) has them.
void print_zero(const nlohmann::json& st, const nlohmann::json& manifest, const std::string& tdir,
                const std::string& part = "") {
  std::vector<std::string> ranks, params;
  for (const auto& [name, rec] : manifest.at("files").items()) {
    if (name.starts_with(part + "zero/rank_")) ranks.push_back(name);
    if (name.starts_with("universal/")) params.push_back(name);
  }
  if (st.value("universal", false)) {
    std::printf("universal: yes (per-parameter f32 states, loadable at any world size and ZeRO stage), %zu "
                "parameter files under universal/\n", params.size());
    if (!params.empty()) print_tensors("  " + params.front(), tdir + "/" + params.front());
  }
  if (!st.contains("zero")) return;
  const nlohmann::json& z = st.at("zero");
  const int stage = z.value("stage", 0), world = z.value("world_size", 1);
  std::printf("zero: ZeRO stage %d, world size %d, %zu units", stage, world, z.value("units", nlohmann::json::array()).size());
  if (st.contains("layout")) {
    const int64_t n = st.at("layout").value("flat_numel", int64_t(0));
    std::printf(", flat_numel %" PRId64 ", %" PRId64 " elements per rank shard", n, stage > 0 ? n / world : n);
  }
  std::printf("\n");
  for (const auto& f : ranks) {
    std::printf("  %s:", f.c_str());
    try {
      SafetensorsFile sf(tdir + "/" + f);
      for (const auto& e : sf.entries()) std::printf(" %s %s%s", e.name.c_str(), dtype_name(e.dtype), shape_str(e.shape).c_str());
    } catch (const std::exception& e) {
      std::printf(" UNREADABLE (%s)", e.what());
    }
    std::printf("\n");
  }
  if (stage > 0 && int(ranks.size()) != world)
    std::printf("  MISSING shard files: %zu of %d present\n", ranks.size(), world);
}

int run_inspect(const CkptOptions& o) {
  std::vector<std::string> tags = list_tags(o.dir);
  std::string latest;
  try {
    latest = read_latest_tag(o.dir);
  } catch (const CheckpointError&) {
  }
  std::printf("checkpoint dir: %s\n", o.dir.c_str());
  std::printf("tags (oldest first):");
  for (const auto& t : tags) std::printf(" %s%s", t.c_str(), t == latest ? " (latest)" : "");
  std::printf("%s\nlatest: %s\n", tags.empty() ? " none" : "", latest.empty() ? "(no latest file)" : latest.c_str());
  try {
    std::printf("latest_universal: %s\n", read_latest_universal_tag(o.dir).c_str());
  } catch (const CheckpointError&) {
  }
  for (const auto& l : checkpoint_leftovers(o.dir))
    std::printf("leftover: %s/%s: %s\n", o.dir.c_str(), l.name.c_str(), l.what.c_str());
  std::string tag = !o.tag.empty() ? o.tag : !latest.empty() ? latest : tags.empty() ? "" : tags.back();
  DSCPP_CHECK(!tag.empty(), o.dir, ": no complete checkpoint tag");
  const std::string tdir = o.dir + "/" + tag;
  const nlohmann::json manifest = read_json_file(tdir + "/manifest.json");

  std::printf("\ntag %s (format %s v%d)\n", tag.c_str(), manifest.value("format", std::string("?")).c_str(),
              manifest.value("format_version", 0));
  std::printf("  %-40s %14s  %-8s  %s\n", "file", "bytes", "crc32", "status");
  int bad = 0;
  uint64_t total = 0;
  std::map<std::string, bool> ok;
  for (const auto& [name, rec] : manifest.at("files").items()) {
    const uint64_t bytes = rec.at("bytes").get<uint64_t>();
    const uint32_t crc = rec.at("crc32").get<uint32_t>();
    const std::string st = file_status(tdir + "/" + name, bytes, crc);
    ok[name] = st == "ok";
    bad += st != "ok";
    total += bytes;
    std::printf("  %-40s %14" PRIu64 "  %08x  %s\n", name.c_str(), bytes, crc, st.c_str());
  }
  std::printf("  %zu files, %s, %s\n", manifest.at("files").size(), human_bytes(total).c_str(),
              bad ? (std::to_string(bad) + " BAD").c_str() : "all checksums ok");

  if (ok["engine_state.json"]) {
    const nlohmann::json st = read_json_file(tdir + "/engine_state.json");
    if (st.contains("model_config")) {
      ModelConfig cfg = ModelConfig::from_hf_json(st.at("model_config"));
      std::printf("\nmodel: %s, %" PRId64 " parameters, %" PRId64 " layers, n_embd %" PRId64 ", heads %" PRId64
                  "/%" PRId64 ", ffn %" PRId64 ", vocab %" PRId64 ", context %" PRId64 ", %s embeddings\n",
                  cfg.arch.c_str(), cfg.num_parameters(), cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head,
                  cfg.n_ffn, cfg.vocab_size, cfg.max_seq_len, cfg.tie_embeddings ? "tied" : "untied");
    }
    std::printf("precision: %s\n", st.value("precision", std::string("?")).c_str());
    for (const char* k : {"global_steps", "global_samples", "micro_steps", "skipped_steps", "dp_world_size"})
      if (st.contains(k)) std::printf("%s: %s\n", k, st.at(k).dump().c_str());
    for (const char* k : {"optimizer", "lr_scheduler", "loss_scaler"})
      if (st.contains(k)) std::printf("%s: %s\n", k, st.at(k).dump().c_str());
    print_zero(st, manifest, tdir);
    if (st.contains(kModelParallelKey)) {  // Note [Model-parallel checkpoints]
      const nlohmann::json& mp = st.at(kModelParallelKey);
      std::printf("model parallel: %s parts, tensor-parallel size %s\n",
                  mp.value("size", nlohmann::json()).dump().c_str(),
                  mp.value("tensor_parallel_size", nlohmann::json()).dump().c_str());
      for (const auto& part : mp.value("parts", std::vector<std::string>())) {
        const std::string f = part + "engine_state.json";
        if (!ok[f]) {
          std::printf("  %s: engine_state.json MISSING or BAD\n", part.c_str());
          continue;
        }
        const nlohmann::json ps = read_json_file(tdir + "/" + f);
        std::printf("  %s: %zu parameters\n", part.c_str(), ps.value("shards", nlohmann::json::object()).size());
        print_zero(ps, manifest, tdir, part);
      }
    }
    if (st.contains("client_state") && st.at("client_state").is_object()) {
      std::printf("client_state keys:");
      for (const auto& [k, v] : st.at("client_state").items()) std::printf(" %s", k.c_str());
      std::printf("\n");
    }
  }
  if (ok["model_states.safetensors"]) print_tensors("model_states", tdir + "/model_states.safetensors");
  if (ok["optim_states.safetensors"]) {
    SafetensorsFile f(tdir + "/optim_states.safetensors");
    std::printf("optim_states:");
    for (const auto& e : f.entries()) std::printf(" %s %s%s", e.name.c_str(), dtype_name(e.dtype), shape_str(e.shape).c_str());
    std::printf("\n");
  }
  return bad ? 1 : 0;
}

// Where DeepSpeed users run zero_to_fp32, inside the checkpoint folder, an export would replace a tag's own files
// (tokenizer.json) and the tag would no longer load: the output goes beside the tags.
void check_output_beside_tags(const CkptOptions& o, const std::string& out, bool dir_allowed) {
  const std::string tag = tag_holding(o.dir, out);
  if (!tag.empty())
    DSCPP_FAIL("-o ", out, " is inside the checkpoint tag ", o.dir, "/", tag, ", which this command reads: its files "
               "would replace the tag's own and the tag would no longer load. Write beside the tags (-o ",
               dir_allowed ? o.dir + ", the default" : std::string("hf_model"), ")");
  if (!dir_allowed && is_within(out, o.dir) && is_within(o.dir, out))
    DSCPP_FAIL("-o ", out, " is the checkpoint directory this command reads (its `latest` and tags): export to a "
               "folder of its own, e.g. -o hf_model");
}

int run_export(const CkptOptions& o) {
  DSCPP_CHECK(o.format == "safetensors", "--format: only safetensors is supported, got '", o.format, "'");
  check_output_beside_tags(o, o.out, /*dir_allowed=*/false);
  HfExportOptions eo;
  eo.dtype = dtype_from_name(o.dtype);
  eo.max_shard_bytes = parse_byte_size(o.max_shard);
  HfExportResult r = export_hf_checkpoint(o.dir, o.tag, o.out, eo);
  std::printf("exported %" PRId64 " tensors (%s, %s, from %s) to %s:\n", r.num_tensors, human_bytes(r.total_size).c_str(),
              o.dtype.c_str(), r.source.c_str(), o.out.c_str());
  for (const auto& f : r.files) std::printf("  %s\n", f.c_str());
  return 0;
}

int run_to_universal(const CkptOptions& o) {
  check_output_beside_tags(o, o.out.empty() ? o.dir : o.out, /*dir_allowed=*/true);
  UniversalResult r = convert_to_universal(o.dir, o.tag, o.out, o.out_tag);
  std::printf("wrote universal tag %s in %s: %" PRId64 " parameters, states", r.out_tag.c_str(), r.out_dir.c_str(),
              r.num_params);
  for (const auto& s : r.states) std::printf(" %s", s.c_str());
  std::printf(" (from ZeRO stage %d, world size %d)\n", r.source_stage, r.source_world_size);
  std::printf("%s/%s -> %s; latest %s\n", r.out_dir.c_str(), kLatestUniversalFile, r.out_tag.c_str(),
              r.latest_updated ? ("-> " + r.out_tag).c_str() : "unchanged");
  return 0;
}

int run_hf_logits(const CkptOptions& o) {
  if (!o.out.empty() && is_within(o.out, o.dir))
    DSCPP_FAIL("-o ", o.out, " is inside the model folder ", o.dir, " this command reads: write the logits elsewhere");
  ModelConfig cfg = read_hf_config(o.dir);
  auto model = make_model(cfg);
  HfLoadReport rep = load_hf_model(o.dir, *model);
  std::vector<int32_t> ids;
  std::stringstream ss(o.tokens);
  for (std::string t; std::getline(ss, t, ',');) ids.push_back(int32_t(std::stol(t)));
  DSCPP_CHECK(!ids.empty(), "--tokens: give comma-separated token ids");
  Tensor x = Tensor::empty({1, int64_t(ids.size())}, DType::i32);
  for (size_t i = 0; i < ids.size(); i++) x.data<int32_t>()[i] = ids[i];
  Tensor logits = model->logits(x);
  nlohmann::json j = {{"shape", {int64_t(ids.size()), cfg.vocab_size}},
                      {"logits", to_float_vector(logits)},
                      {"ignored", rep.ignored}};
  if (o.out.empty()) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::ofstream(o.out) << j.dump() << "\n";
  }
  return 0;
}
}  // namespace

Command register_ckpt(CLI::App& app) {
  auto o = std::make_shared<CkptOptions>();
  Command c;
  c.app = app.add_subcommand("ckpt", "Inspect checkpoints, export them to Hugging Face format, convert them to "
                                     "universal checkpoints");
  c.app->require_subcommand(1);
  c.app->footer("Examples:\n"
                "  dscpp ckpt inspect out/checkpoints\n"
                "  dscpp ckpt export out/checkpoints --format safetensors -o hf_model --dtype bf16\n"
                "  dscpp ckpt to-universal out/checkpoints");

  CLI::App* inspect = c.app->add_subcommand("inspect", "Tags, latest, file sizes and CRC32 status, model config, "
                                                       "counters, optimizer and scheduler state (exit 1 if a file "
                                                       "is bad)");
  inspect->footer("Examples:\n"
                  "  dscpp ckpt inspect out/checkpoints                    # the tag `latest` names\n"
                  "  dscpp ckpt inspect out/checkpoints --tag global_step100");
  inspect->add_option("dir", o->dir, "Checkpoint directory (holds `latest` and the tags)")->required();
  inspect->add_option("--tag", o->tag, "Tag to inspect (default: latest)");

  CLI::App* exp = c.app->add_subcommand("export", "Write a checkpoint tag as a Hugging Face model folder "
                                                  "(config.json + safetensors, loadable by transformers)");
  exp->footer("Examples:\n"
              "  dscpp ckpt export out/checkpoints --format safetensors -o hf_model\n"
              "  dscpp ckpt export out/checkpoints --tag global_step500 -o hf_model --dtype bf16 --max-shard-size 2GB\n"
              "  python -c \"import transformers as t; t.AutoModelForCausalLM.from_pretrained('hf_model')\"");
  exp->add_option("dir", o->dir, "Checkpoint directory")->required();
  exp->add_option("--format", o->format, "Output format")->capture_default_str()->check(CLI::IsMember({"safetensors"}));
  exp->add_option("-o,--output", o->out, "Output folder (created; stale weight files in it are replaced)")->required();
  exp->add_option("--tag", o->tag, "Tag to export (default: latest)");
  exp->add_option("--dtype", o->dtype, "Tensor dtype in the files")->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  exp->add_option("--max-shard-size", o->max_shard, "Largest shard (5GB = 5e9 bytes, 2GiB, 500MB; as transformers)")
      ->capture_default_str();

  CLI::App* uni = c.app->add_subcommand("to-universal", "Convert a ZeRO checkpoint tag (any stage and world size) to "
                                                        "a universal tag, loadable at any world size and stage");
  uni->footer("Examples:\n"
              "  dscpp ckpt to-universal out/checkpoints                 # latest -> <tag>_universal, same dir\n"
              "  dscpp ckpt to-universal out/checkpoints --tag global_step500 --output resharded --output-tag step500\n"
              "In the same directory `latest` is left alone and `latest_universal` names the new tag; in another\n"
              "directory both name it.");
  uni->add_option("dir", o->dir, "Checkpoint directory")->required();
  uni->add_option("--tag", o->tag, "Tag to convert (default: latest)");
  uni->add_option("-o,--output", o->out, "Directory of the universal tag (default: the checkpoint directory)");
  uni->add_option("--output-tag", o->out_tag, "Universal tag name (default: <tag>_universal)");

  CLI::App* lg = c.app->add_subcommand("hf-logits", "Load a Hugging Face folder into our model (f32, CPU) and print "
                                                     "the logits of one sequence as JSON");
  lg->footer("Examples:\n"
             "  dscpp ckpt hf-logits hf_model --tokens 1,2,3 -o logits.json   # tests/python/test_hf_transformers.py");
  lg->add_option("dir", o->dir, "Hugging Face model folder")->required();
  lg->add_option("--tokens", o->tokens, "Comma-separated token ids")->capture_default_str();
  lg->add_option("-o,--output", o->out, "Write the JSON here (default: stdout)");

  c.run = [o, inspect, exp, uni, lg] {
    if (inspect->parsed()) return run_inspect(*o);
    if (exp->parsed()) return run_export(*o);
    if (uni->parsed()) return run_to_universal(*o);
    if (lg->parsed()) return run_hf_logits(*o);
    return 2;
  };
  return c;
}

}  // namespace dscpp::cli
