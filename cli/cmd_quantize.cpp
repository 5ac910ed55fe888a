// dscpp quantize: a Hugging Face folder -> a folder of ours with int8, int4 or fp8 weights (Note [Quantized folder],
// docs/QUANTIZATION.md), which `dscpp generate` / `dscpp serve` / the engine then load like any model.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/inference/quantization.h"

namespace fs = std::filesystem;

namespace dscpp::cli {

namespace {
struct QuantizeOptions {
  std::string hf, out, weights, dtype;
  int64_t group = 128;
  bool lm_head = false;
  std::string shard_size = "5GB";
  std::string calibration;       // AWQ: a text file (Note [AWQ scaling])
  int64_t calibration_tokens = 8192, calibration_seq = 512;
  inference::AwqOptions awq;
};

// The calibration text tokenized with the folder's tokenizer, cut into sequences of at most `seq` tokens (and the
// model's context), `tokens` in all at most.
std::vector<std::vector<int32_t>> calibration_sequences(const QuantizeOptions& o, int64_t context) {
  const std::string tok_path = o.hf + "/tokenizer.json";
  DSCPP_CHECK(std::ifstream(tok_path).good(), "--awq-calibration: ", o.hf, " has no tokenizer.json to tokenize ",
              o.calibration, " with");
  std::ifstream in(o.calibration, std::ios::binary);
  DSCPP_CHECK(in.good(), "--awq-calibration ", o.calibration, ": cannot read it");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> all = Tokenizer::load_hf(tok_path).encode(ss.str());
  const int64_t seq = std::min(o.calibration_seq, context), n = std::min<int64_t>(int64_t(all.size()),
                                                                                    o.calibration_tokens);
  DSCPP_CHECK(n >= 2, "--awq-calibration ", o.calibration, ": ", all.size(), " tokens, too few to calibrate on");
  std::vector<std::vector<int32_t>> out;
  for (int64_t b = 0; b < n; b += seq) out.emplace_back(all.begin() + b, all.begin() + std::min(n, b + seq));
  return out;
}

// "<what>: 40% (2.9 of 7.2 GB), 0:12 elapsed, ETA 0:18" on stderr: rewritten in place on a terminal, else a line
// per tenth.
class Progress {
 public:
  Progress(const char* what, const char* unit) : what_(what), unit_(unit), tty_(isatty(STDERR_FILENO) == 1) {}
  void operator()(int64_t done, int64_t total) {
    const int tenth = total > 0 ? int(10 * done / total) : 10;
    if (!tty_ && tenth == reported_) return;
    reported_ = tenth;
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    const double eta = done > 0 ? t * double(total - done) / double(done) : 0;
    std::fprintf(stderr, "%s%s: %3d%% (%.2f of %.2f %s), %s elapsed, ETA %s%s", tty_ ? "\r" : "", what_,
                 int(100 * done / std::max<int64_t>(total, 1)), double(done) / 1e9, double(total) / 1e9, unit_,
                 clock(t).c_str(), clock(eta).c_str(), tty_ && done < total ? "" : "\n");
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::string clock(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%ld:%02ld", long(s) / 60, long(s) % 60);
    return buf;
  }
  const char *what_, *unit_;
  bool tty_;
  int reported_ = -1;
  Clock::time_point t0_ = Clock::now();
};

// The dtype the source stores its weights in (config.json's torch_dtype, or dtype in newer transformers): the
// unquantized tensors keep it. f32 when the folder does not say, so nothing is rounded unasked.
DType source_dtype(const nlohmann::json& config) {
  const std::string d = config.value("torch_dtype", config.value("dtype", std::string("float32")));
  return d == "bfloat16" ? DType::bf16 : d == "float16" ? DType::f16 : DType::f32;
}

int run_quantize(const QuantizeOptions& o) {
  refuse_output_on_inputs("--out", o.out, /*out_is_dir=*/true, {{"--hf", o.hf}});
  DSCPP_CHECK(o.group % 2 == 0, "--group ", o.group, ": must be even (two int4 weights share a byte)");
  DSCPP_CHECK(!fs::exists(o.out), "--out ", o.out, " already exists: the quantized folder is written as a new one");
  inference::WeightQuantConfig q;
  q.enabled = true;
  q.num_bits = o.weights == "int4" ? 4 : 8;
  q.fp8 = o.weights == "fp8";
  q.group_size = o.group;
  q.lm_head = o.lm_head;
  inference::LoadOptions lo;  // f32 on the host: the exact source values
  inference::InferenceModel m = inference::load_inference_model(o.hf, lo);
  if (!o.calibration.empty()) {  // Note [AWQ scaling]
    const auto seqs = calibration_sequences(o, m.cfg.max_context);
    int64_t n = 0;
    for (const auto& s : seqs) n += int64_t(s.size());
    std::fprintf(stderr, "AWQ: calibrating on %lld tokens of %s (%zu sequences)\n", (long long)n,
                 o.calibration.c_str(), seqs.size());
    const auto chosen = inference::awq_scale(m, q, seqs, o.awq, [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\rAWQ: %lld of %lld linears searched", (long long)done, (long long)total);
      if (done == total) std::fprintf(stderr, "\n");
    });
    double rtn = 0, awq = 0;
    int64_t moved = 0;
    for (const auto& r : chosen) rtn += r.rtn_error, awq += r.awq_error, moved += r.alpha > 0;
    std::fprintf(stderr, "AWQ: %lld of %zu linears scaled; their output error on the calibration rows %.4g of "
                 "round-to-nearest's\n", (long long)moved, chosen.size(), rtn > 0 ? awq / rtn : 1.0);
  }
  inference::quantize_weights(m, q, Progress("quantizing", "G weights"));
  inference::QuantizedFolderOptions so;
  so.dense_dtype = o.dtype.empty() ? source_dtype(read_json_file(o.hf + "/config.json")) : dtype_from_name(o.dtype);
  so.max_shard_bytes = parse_byte_size(o.shard_size);
  so.progress = Progress("writing", "GB");
  inference::save_quantized_folder(m, o.hf, o.out, so);
  std::fprintf(stderr, "wrote %s: %s weights, other tensors %s\n", o.out.c_str(), q.name().c_str(),
               dtype_name(so.dense_dtype));
  return 0;
}
}  // namespace

Command register_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  Command c;
  c.app = app.add_subcommand("quantize", "Convert a Hugging Face model folder to int8, int4 or fp8 weights");
  c.app->footer(
      "The linears (q/k/v, o, gate/up, down; the lm head with --lm-head) are rounded to nearest (after AWQ's\n"
      "activation-aware scaling with --awq-calibration TEXT): int8 with one scale\n"
      "per output channel, int4 with a scale and a zero point per --group columns, fp8 (e4m3) with one scale per\n"
      "output channel (its activations are quantized per token as it runs). The embedding and norms keep the\n"
      "source's dtype. The output folder loads in `dscpp generate` / `dscpp serve` like any model\n"
      "(docs/QUANTIZATION.md).\n"
      "Examples:\n"
      "  dscpp quantize --hf path/to/Llama-3.2-1B --out Llama-3.2-1B-int4 --weights int4\n"
      "  dscpp quantize --hf path/to/gpt2 --out gpt2-int8 --weights int8\n"
      "  dscpp quantize --hf path/to/Llama-3.1-8B --out Llama-3.1-8B-fp8 --weights fp8\n"
      "  dscpp quantize --hf path/to/Llama-3.2-1B --out Llama-3.2-1B-awq --weights int4 --awq-calibration wiki.train.raw");
  c.app->add_option("--hf", o->hf, "The Hugging Face model folder to read (config.json, safetensors, tokenizer)")
      ->required()->check(CLI::ExistingDirectory);
  c.app->add_option("--out", o->out, "The folder to write (must not exist)")->required();
  c.app->add_option("--weights", o->weights, "int8, int4 or fp8")->required()
      ->check(CLI::IsMember({"int8", "int4", "fp8"}));
  c.app->add_option("--group", o->group, "int4: columns per scale and zero point (even, dividing each linear's "
                    "inputs)")->capture_default_str()->check(whole(2, 1 << 16));
  c.app->add_flag("--lm-head", o->lm_head, "Quantize the lm head too (vLLM and torchao keep it 16-bit)");
  c.app->add_option("--dtype", o->dtype, "The unquantized tensors' dtype (default: the source's torch_dtype)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c.app->add_option("--shard-size", o->shard_size, "Tensor bytes per safetensors file")->capture_default_str();
  c.app->add_option("--awq-calibration", o->calibration, "AWQ: scale each linear's input channels by their "
                    "activations on this text before rounding (docs/QUANTIZATION.md)")->check(CLI::ExistingFile);
  c.app->add_option("--awq-tokens", o->calibration_tokens, "AWQ: calibration tokens at most")
      ->capture_default_str()->check(whole(2, int64_t(1) << 30));
  c.app->add_option("--awq-seq", o->calibration_seq, "AWQ: tokens per calibration sequence (at most the context)")
      ->capture_default_str()->check(whole(2, int64_t(1) << 20));
  c.app->add_option("--awq-grid", o->awq.grid, "AWQ: scale exponents searched per linear, 0 to 1 in this many steps")
      ->capture_default_str()->check(whole(1, 1000));
  c.app->add_option("--awq-rows", o->awq.sample_rows, "AWQ: calibration rows per linear the error is measured on")
      ->capture_default_str()->check(whole(1, int64_t(1) << 20));
  c.run = [o] { return run_quantize(*o); };
  return c;
}

}  // namespace dscpp::cli
