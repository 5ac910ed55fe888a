// Checkpoint save/load speed of the engine, one process (world size 1), public API only:
//   ckpt_bench --dir PATH [--model llama-1b] [--device cpu|cuda] [--steps 1] [--batch 1] [--seq 64]
//              [--async-saves 2] [--keep]
// Builds the model (CUDA: bf16 parameters with f32 masters, the bf16 config; CPU: f32), trains --steps AdamW steps
// on random tokens so the optimizer states exist, then measures:
//   sync save    save_checkpoint(PATH/sync, "bench"): wall time, bytes of the tag on disk, GB/s
//   async save   set_async_checkpointing(true), --async-saves saves into PATH/async: the caller's stall
//                (last_save_stall_seconds) and the time from the call until wait_for_checkpoint() returns, GB/s of
//                that; the first save pays for allocating the host snapshot, later ones show the steady state
//   verify       every data file of the last async tag is byte-identical to the sync tag's (manifest.json differs
//                only in created_unix_ns, so its "files" table is compared instead)
//   load         a fresh engine, load_checkpoint(PATH/sync, "bench"): cold (the tag's pages dropped from the page
//                cache with posix_fadvise first) and warm (again, straight after); the loaded parameters must have
//                the saved parameters' CRC32 and global_steps must match
// A 1B f32 model with AdamW needs ~16 GB of host memory on the CPU plus ~12 GB for the async snapshot: pick a
// smaller preset (--model gpt2-medium) on a small machine. The table says which model ran. Disk: two tags at most
// (llama-1b: ~17 GB each with bf16 parameters, ~15 GB f32). Removes its tags at the end unless --keep.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/crc32.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"

#include "bench_flags.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string model = "llama-1b", device = "cpu", dir;
  int64_t steps = 1, batch = 1, seq = 64, async_saves = 2;
  bool keep = false;
};

const bench::Flags kFlags{"ckpt_bench",
                          "ckpt_bench --dir PATH [--model llama-1b] [--device cpu|cuda] [--steps 1]\n"
                          "                  [--batch 1] [--seq 64] [--async-saves 2] [--keep]\n"};
[[noreturn]] void usage(const std::string& why) { kFlags.fail(why); }

Args parse(int argc, char** argv) {
  Args a;
  kFlags.parse(argc, argv, {"keep"}, [&](const std::string&) { a.keep = true; },
               [&](const std::string& k, const std::string& v) {
                 if (k == "model") a.model = v;
                 else if (k == "device") a.device = v;
                 else if (k == "dir") a.dir = v;
                 else if (k == "steps") a.steps = kFlags.to_int(k, v, 1);
                 else if (k == "batch") a.batch = kFlags.to_int(k, v, 1);
                 else if (k == "seq") a.seq = kFlags.to_int(k, v, 1);
                 else if (k == "async-saves") a.async_saves = kFlags.to_int(k, v, 1);
                 else usage("unknown option --" + k);
               });
  if (a.dir.empty()) usage("--dir is required");
  if (a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  return a;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void progress(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void progress(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("[ckpt_bench] ");
  std::vprintf(fmt, ap);
  std::printf("\n");
  std::fflush(stdout);
  va_end(ap);
}

DeepSpeedConfig bench_config(const Args& a) {
  const std::string prec = a.device == "cuda" ? R"(, "bf16": {"enabled": true})" : "";
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
      R"(, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.1}},
          "gradient_clipping": 1.0)" + prec + "}");
}

std::unique_ptr<Engine> build_engine(const ModelConfig& mc, const DeepSpeedConfig& cfg, const Args& a, bool init) {
  const Device dev = a.device == "cuda" ? Device::cuda(0) : Device::cpu();
  auto model = make_model(mc, {model_dtype(cfg), dev});
  if (init) model->init_weights(1234);
  return initialize(std::move(model), cfg);
}

void sync_device(const Args& a) {
  if (a.device == "cuda") cuda_synchronize(0);
}

uint64_t tag_bytes(const fs::path& tag_dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(tag_dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

std::vector<std::string> tag_files(const fs::path& tag_dir) {  // relative names, sorted
  std::vector<std::string> v;
  for (const auto& e : fs::recursive_directory_iterator(tag_dir))
    if (e.is_regular_file()) v.push_back(fs::relative(e.path(), tag_dir).string());
  std::sort(v.begin(), v.end());
  return v;
}

// Empty when the two files have the same bytes, else why not.
std::string compare_files(const fs::path& x, const fs::path& y) {
  std::ifstream fx(x, std::ios::binary), fy(y, std::ios::binary);
  if (!fx || !fy) return "cannot open";
  if (fs::file_size(x) != fs::file_size(y))
    return "sizes differ (" + std::to_string(fs::file_size(x)) + " vs " + std::to_string(fs::file_size(y)) + ")";
  constexpr size_t kChunk = size_t(64) << 20;
  std::vector<char> bx(kChunk), by(kChunk);
  uint64_t off = 0;
  while (fx && fy) {
    fx.read(bx.data(), kChunk);
    fy.read(by.data(), kChunk);
    const size_t nx = size_t(fx.gcount()), ny = size_t(fy.gcount());
    if (nx != ny) return "short read at byte " + std::to_string(off);
    if (std::memcmp(bx.data(), by.data(), nx) != 0) {
      size_t i = 0;
      while (bx[i] == by[i]) i++;
      return "first difference at byte " + std::to_string(off + i);
    }
    off += nx;
    if (nx < kChunk) break;
  }
  return "";
}

// Every file of tag x byte-identical to tag y's; manifest.json by its "files" table (created_unix_ns differs).
bool tags_identical(const fs::path& x, const fs::path& y) {
  const auto fx = tag_files(x), fy = tag_files(y);
  if (fx != fy) {
    progress("verify: the tags hold different file lists (%zu vs %zu files)", fx.size(), fy.size());
    return false;
  }
  bool ok = true;
  for (const std::string& f : fx) {
    if (f == "manifest.json") {
      auto jx = nlohmann::json::parse(std::ifstream(x / f)), jy = nlohmann::json::parse(std::ifstream(y / f));
      const bool same = jx.at("files") == jy.at("files");
      progress("verify: %-32s %s", f.c_str(), same ? "same files table (sizes, CRC32s)" : "files tables DIFFER");
      ok &= same;
      continue;
    }
    const std::string why = compare_files(x / f, y / f);
    progress("verify: %-32s %s", f.c_str(), why.empty() ? "byte-identical" : why.c_str());
    ok &= why.empty();
  }
  return ok;
}

// Asks the kernel to drop the tag's (clean, fsynced) pages from the page cache, so the next read comes from disk.
bool drop_page_cache(const fs::path& tag_dir) {
  bool ok = true;
  for (const std::string& f : tag_files(tag_dir)) {
    const int fd = ::open((tag_dir / f).c_str(), O_RDONLY);
    if (fd < 0) {
      ok = false;
      continue;
    }
    ok &= ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return ok;
}

uint32_t params_crc(Engine& e) {
  Tensor p = e.gather_full_params();  // model dtype, flat
  if (p.device().is_cuda()) p = p.to(Device::cpu());
  return crc32_update(0, p.raw(), p.nbytes());
}

double gbps(uint64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e9 : 0.0; }

struct Row {
  std::string what;
  double seconds, stall;  // stall < 0: not applicable
  uint64_t bytes;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (a.device == "cuda" && !cuda_available()) {
      std::fprintf(stderr, "ckpt_bench: --device cuda but no CUDA device (or a CPU-only build)\n");
      return 1;
    }
    const ModelConfig mc = ModelConfig::preset(a.model);
    const DeepSpeedConfig cfg = bench_config(a);
    const std::string dtype = dtype_name(model_dtype(cfg));
    const std::string where = a.device == "cuda" ? cuda_device_name(0) : "CPU";
    progress("model %s (%s): %" PRId64 " parameters (%.1f M), %s parameters on %s, AdamW", a.model.c_str(),
             mc.arch.c_str(), mc.num_parameters(), double(mc.num_parameters()) / 1e6, dtype.c_str(), where.c_str());
    const fs::path root = fs::absolute(a.dir), sync_dir = root / "sync", async_dir = root / "async";
    fs::remove_all(sync_dir);
    fs::remove_all(async_dir);
    fs::create_directories(root);

    double t = now_s();
    auto engine = build_engine(mc, cfg, a, true);
    progress("engine built in %.1f s; %s", now_s() - t, engine->model_state_report().c_str());

    Tensor x = Tensor::empty({a.batch, a.seq}, DType::i32), y = Tensor::empty({a.batch, a.seq}, DType::i32);
    Rng rng(42);
    for (int64_t s = 0; s < a.steps; s++) {
      for (int64_t i = 0; i < x.numel(); i++) {
        x.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
        y.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
      }
      t = now_s();
      engine->forward(x, y);
      engine->backward();
      engine->step();
      sync_device(a);
      progress("train step %" PRId64 ": loss %.4f, %.1f s", s + 1, engine->last_loss(), now_s() - t);
    }
    const uint32_t saved_crc = params_crc(*engine);
    const int64_t saved_steps = engine->global_steps();
    std::vector<Row> rows;

    progress("sync save -> %s/bench ...", sync_dir.c_str());
    t = now_s();
    engine->save_checkpoint(sync_dir.string(), "bench");
    const double sync_s = now_s() - t;
    const uint64_t bytes = tag_bytes(sync_dir / "bench");
    rows.push_back({"sync save", sync_s, engine->last_save_stall_seconds(), bytes});
    progress("sync save: %.2f s, %.2f GB, %.2f GB/s", sync_s, double(bytes) / 1e9, gbps(bytes, sync_s));

    engine->set_async_checkpointing(true);
    std::string last_async;
    for (int64_t k = 1; k <= a.async_saves; k++) {
      const std::string tag = "bench_a" + std::to_string(k);
      if (!last_async.empty()) fs::remove_all(async_dir / last_async);  // disk use: two tags at most
      progress("async save %" PRId64 " -> %s/%s ...", k, async_dir.c_str(), tag.c_str());
      t = now_s();
      engine->save_checkpoint(async_dir.string(), tag);
      const double call_s = now_s() - t, stall = engine->last_save_stall_seconds();
      progress("async save %" PRId64 ": returned after %.3f s (stall %.3f s), writing in the background", k, call_s,
               stall);
      engine->wait_for_checkpoint();
      const double total = now_s() - t;
      const uint64_t b = tag_bytes(async_dir / tag);
      rows.push_back({"async save " + std::to_string(k), total, stall, b});
      progress("async save %" PRId64 ": done after %.2f s, %.2f GB/s", k, total, gbps(b, total));
      last_async = tag;
    }
    engine->set_async_checkpointing(false);

    progress("verify: %s/%s against %s/bench ...", async_dir.c_str(), last_async.c_str(), sync_dir.c_str());
    const bool identical = tags_identical(async_dir / last_async, sync_dir / "bench");

    engine.reset();  // frees the first engine before the second is built (host memory on the CPU)
    progress("building a fresh engine for loading ...");
    auto fresh = build_engine(mc, cfg, a, false);
    bool loaded_ok = true;
    for (const char* kind : {"cold", "warm"}) {
      const bool cold = std::strcmp(kind, "cold") == 0;
      const bool dropped = cold ? drop_page_cache(sync_dir / "bench") : true;
      progress("%s load <- %s/bench%s ...", kind, sync_dir.c_str(),
               cold ? (dropped ? " (page cache dropped)" : " (dropping the page cache FAILED)") : "");
      t = now_s();
      fresh->load_checkpoint(sync_dir.string(), "bench");
      sync_device(a);
      const double s = now_s() - t;
      rows.push_back({std::string(kind) + " load", s, -1, bytes});
      const bool ok = params_crc(*fresh) == saved_crc && fresh->global_steps() == saved_steps;
      loaded_ok &= ok;
      progress("%s load: %.2f s, %.2f GB/s; parameters and step %s", kind, s, gbps(bytes, s),
               ok ? "match the saved ones" : "DIFFER from the saved ones");
    }
    fresh.reset();
    if (!a.keep) {
      fs::remove_all(sync_dir);
      fs::remove_all(async_dir);
    }

    std::printf("\nckpt_bench: %s, %.1f M parameters, %s on %s, AdamW, world size 1; tag %.2f GB\n", a.model.c_str(),
                double(mc.num_parameters()) / 1e6, dtype.c_str(), where.c_str(), double(bytes) / 1e9);
    std::printf("%-14s %10s %10s %10s %8s\n", "phase", "seconds", "stall s", "GB", "GB/s");
    for (const Row& r : rows) {
      char stall[32] = "-";
      if (r.stall >= 0) std::snprintf(stall, sizeof stall, "%.3f", r.stall);
      std::printf("%-14s %10.2f %10s %10.2f %8.2f\n", r.what.c_str(), r.seconds, stall, double(r.bytes) / 1e9,
                  gbps(r.bytes, r.seconds));
    }
    std::printf("async tag byte-identical to sync tag: %s; loaded state matches: %s\n", identical ? "yes" : "NO",
                loaded_ok ? "yes" : "NO");
    std::fflush(stdout);
    return identical && loaded_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_bench: %s\n", e.what());
    return 1;
  }
}
