// dscpp tokenize: text files -> token shards (documents separated by the end-of-text token), with a tokenizer that
// is loaded (tokenizer.json, or GPT-2 vocab.json + merges.txt) or trained on the input.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "dscpp/core/check.h"
#include "dscpp/data/corpus.h"
#include "dscpp/data/shard.h"
#include "dscpp/data/tokenizer.h"

namespace dscpp::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer, vocab, merges, save_tokenizer, out_dir, doc_separator;
  int train_vocab = 0;
  int64_t shard_tokens = 100'000'000;
  std::vector<std::string> inputs;
};

std::vector<std::string> read_documents(const TokenizeOptions& o) {
  if (o.inputs.empty()) return default_corpus_documents();
  std::vector<std::string> docs;
  for (auto& path : o.inputs) {
    std::ifstream in(path, std::ios::binary);
    DSCPP_CHECK(in.good(), "cannot read input ", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    for (auto& d : split_documents(ss.str(), o.doc_separator)) docs.push_back(std::move(d));
  }
  return docs;
}

Tokenizer make_tokenizer(const TokenizeOptions& o, const std::vector<std::string>& docs) {
  int sources = !o.tokenizer.empty() + !o.vocab.empty() + (o.train_vocab > 0);
  DSCPP_CHECK(sources == 1, "give exactly one of --tokenizer, --vocab/--merges or --train-vocab");
  if (!o.tokenizer.empty()) return Tokenizer::load_hf(o.tokenizer);
  if (!o.vocab.empty()) {
    DSCPP_CHECK(!o.merges.empty(), "--vocab needs --merges");
    return Tokenizer::load_gpt2(o.vocab, o.merges);
  }
  std::string text;
  for (auto& d : docs) {
    if (!text.empty()) text += kEotToken;
    text += d;
  }
  auto t0 = std::chrono::steady_clock::now();
  Tokenizer t = Tokenizer::train(text, o.train_vocab);
  std::fprintf(stderr, "trained a %d-token vocab on %.1f MB in %.1f s\n", t.vocab_size(), text.size() / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return t;
}

int run_tokenize(const TokenizeOptions& o) {
  namespace fs = std::filesystem;
  std::string save = o.save_tokenizer;
  if (save.empty() && o.train_vocab > 0) save = (fs::path(o.out_dir) / "tokenizer.json").string();
  std::vector<InputPath> reads = {{"--tokenizer", o.tokenizer}, {"--vocab", o.vocab}, {"--merges", o.merges}};
  for (const auto& in : o.inputs) reads.push_back({"input", in});
  refuse_output_on_inputs("-o", o.out_dir, /*out_is_dir=*/true, reads);
  if (!save.empty()) refuse_output_on_inputs("--save-tokenizer", save, /*out_is_dir=*/false, reads);
  std::vector<std::string> docs = read_documents(o);
  DSCPP_CHECK(!docs.empty(), "no documents in the input");
  Tokenizer tok = make_tokenizer(o, docs);
  fs::create_directories(o.out_dir);
  if (!save.empty()) {
    tok.save_hf(save);
    std::fprintf(stderr, "saved tokenizer to %s\n", save.c_str());
  }

  // The shards record their tokenizer, so training refuses them with another (shard.h).
  const ShardTokenizer made_by{tok.fingerprint(), !save.empty()           ? save
                                                  : !o.tokenizer.empty() ? o.tokenizer
                                                                         : o.vocab};
  const int32_t bos = tok.bos_id();
  std::vector<int32_t> buf;
  int shard = 0;
  int64_t total_tokens = 0, total_bytes = 0;
  auto flush = [&] {
    char name[32];
    std::snprintf(name, sizeof name, "shard_%05d.bin", shard++);
    write_token_shard((fs::path(o.out_dir) / name).string(), buf, tok.vocab_size(), made_by);
    buf.clear();
  };
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (size_t i = 0; i < docs.size(); i++) {
    buf.push_back(bos);  // each document starts with EOT as in GPT-2's training data (Llama 3: <|begin_of_text|>)
    std::vector<int32_t> ids = tok.encode_ordinary(docs[i]);
    buf.insert(buf.end(), ids.begin(), ids.end());
    total_tokens += int64_t(ids.size()) + 1;
    total_bytes += int64_t(docs[i].size());
    if (int64_t(buf.size()) >= o.shard_tokens) flush();
    auto now = std::chrono::steady_clock::now();
    if (now - last > std::chrono::milliseconds(500) || i + 1 == docs.size()) {
      double secs = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "\rtokenized %zu/%zu documents, %.1f MB -> %lld tokens (%.2f bytes/token, %.1f MB/s)",
                   i + 1, docs.size(), total_bytes / 1e6, (long long)total_tokens,
                   double(total_bytes) / double(std::max<int64_t>(total_tokens, 1)),
                   total_bytes / 1e6 / std::max(secs, 1e-9));
      last = now;
    }
  }
  if (!buf.empty() || shard == 0) flush();
  std::fprintf(stderr, "\nwrote %d shard(s) to %s (vocab %d, each document after token %d)\n", shard,
               o.out_dir.c_str(), tok.vocab_size(), bos);
  return 0;
}

}  // namespace

Command register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  Command c;
  c.app = app.add_subcommand("tokenize", "Tokenize text files into token shards for training");
  c.app->footer(
      "Documents are separated by the end-of-text token (each starts with it). Without input files the built-in\n"
      "corpus (Debian's fortunes) is used.\n"
      "Examples:\n"
      "  dscpp tokenize --train-vocab 4096 -o data/fortunes                 # built-in corpus, new tokenizer\n"
      "  dscpp tokenize --tokenizer gpt2/tokenizer.json -o data/wiki wiki.txt\n"
      "  dscpp tokenize --vocab vocab.json --merges merges.txt -o data/x a.txt b.txt\n"
      "  dscpp tokenize --train-vocab 8192 --save-tokenizer tok.json --doc-separator '%' -o data/q quotes.txt");
  c.app->add_option("inputs", o->inputs, "Input text files (default: the built-in corpus)")->check(CLI::ExistingFile);
  c.app->add_option("-o,--out", o->out_dir, "Output directory for shard_NNNNN.bin files")->required();
  c.app->add_option("--tokenizer", o->tokenizer, "Hugging Face tokenizer.json (byte-level BPE)")
      ->check(CLI::ExistingFile);
  c.app->add_option("--vocab", o->vocab, "GPT-2 vocab.json (with --merges)")->check(CLI::ExistingFile);
  c.app->add_option("--merges", o->merges, "GPT-2 merges.txt (with --vocab)")->check(CLI::ExistingFile);
  c.app->add_option("--train-vocab", o->train_vocab, "Train a tokenizer of this vocab size on the input")
      ->check(whole(257, 1 << 20));
  c.app->add_option("--save-tokenizer", o->save_tokenizer,
                    "Save the tokenizer as tokenizer.json here (default with --train-vocab: OUT/tokenizer.json)");
  c.app->add_option("--doc-separator", o->doc_separator,
                    "A line equal to this separates documents (default: each file is one document)");
  c.app->add_option("--shard-tokens", o->shard_tokens, "Tokens per shard file")
      ->capture_default_str()->check(whole(1));
  c.run = [o] { return run_tokenize(*o); };
  return c;
}

}  // namespace dscpp::cli
