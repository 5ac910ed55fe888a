// The tokenizer and token shards of a training run (train_data.h).
//
// Note [Data cache key]
// ~~~~~~~~~~~~~~~~~~~~~
// Text is tokenized once into <out>/data (tokenizer.json when one is trained, train_000.bin) and reused by later
// runs into the same --out: the default run's second start, a resume. Reuse is only right while the cache is what
// this run would make, so <out>/data/cache.json records what made it:
//   inputs      every input's name, size and CRC32 (the built-in corpus counts as one input, its documents joined)
//   tokenizer   "trained" with its vocab size, or the fingerprint of the --tokenizer given (Tokenizer::fingerprint)
//   made        the fingerprint of the tokenizer the shard was made with (its own header records it too)
//   version     kCacheVersion and the shard format; bumped when tokenizer training or the layout of documents change
// A run compares its own key with the record; any difference (another --data, an edited file, another
// --vocab-size or --tokenizer, a file of the cache changed or missing, an older version's cache without a record)
// rebuilds the cache and says why. The record is removed before a rebuild and written last, so a build killed
// midway leaves no record and the next run rebuilds. Names are only for messages: the same bytes under another
// path are the same input.
#include "dscpp/data/train_data.h"

#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dscpp/core/check.h"
#include "dscpp/data/corpus.h"
#include "dscpp/data/shard.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kKeyFile = "cache.json";
constexpr const char* kShardFile = "train_000.bin";
constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr int kCacheVersion = 1;

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) DSCPP_FAIL("--data ", path, ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool is_shard(const std::string& p) { return fs::path(p).extension() == ".bin"; }

// The documents of the text inputs and the inputs' identity (Note [Data cache key]).
struct TextInputs {
  std::vector<std::string> docs;
  nlohmann::json key = nlohmann::json::array();  // [{"name", "bytes", "crc32"}]
};

void add_input(TextInputs& in, const std::string& name, const std::string& bytes) {
  const uint32_t crc = uint32_t(crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
  in.key.push_back({{"name", name}, {"bytes", bytes.size()}, {"crc32", crc}});
}

TextInputs read_inputs(const std::vector<std::string>& texts) {
  TextInputs in;
  if (texts.empty()) {
    in.docs = default_corpus_documents();
    std::string joined;
    for (const auto& d : in.docs) joined += d, joined += '\n';
    add_input(in, std::string("the built-in corpus (") + kFortunesDir + ")", joined);
  }
  for (const auto& t : texts) {
    in.docs.push_back(read_file(t));
    add_input(in, t, in.docs.back());
  }
  return in;
}

std::string describe_inputs(const nlohmann::json& inputs) {
  std::string s;
  for (const auto& i : inputs) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%llu bytes, CRC32 %08x)", i.at("bytes").get<unsigned long long>(),
                  i.at("crc32").get<uint32_t>());
    s += (s.empty() ? "" : ", ") + i.at("name").get<std::string>() + buf;
  }
  return s;
}

std::string describe_tokenizer(const nlohmann::json& t) {
  if (t.contains("trained_vocab_size"))
    return "a tokenizer trained on it with --vocab-size " + t.at("trained_vocab_size").dump();
  return "--tokenizer " + t.at("name").get<std::string>() + " (fingerprint " + t.at("fingerprint").get<std::string>() +
         ")";
}

// Why the cache in `dir` is not what `key` would make ("" when it is). Products are checked too: the trained
// tokenizer (loaded into *cached_tokenizer) and the shard must be the ones the record names.
std::string stale_reason(const fs::path& dir, const nlohmann::json& key, Tokenizer* cached_tokenizer) {
  const fs::path record = dir / kKeyFile;
  if (!fs::exists(record))
    return "it has no record of what it was made from (" + record.string() +
           " is missing: an older version made it, or its build was interrupted)";
  nlohmann::json old;
  try {
    std::ifstream f(record);
    old = nlohmann::json::parse(f);
    if (old.value("version", 0) != key.at("version") || old.value("shard_version", 0) != key.at("shard_version"))
      return "an older version made it (cache version " + old.value("version", nlohmann::json(0)).dump() + ")";
    std::vector<std::pair<uint64_t, uint32_t>> a, b;
    for (const auto& i : old.at("inputs")) a.emplace_back(i.at("bytes").get<uint64_t>(), i.at("crc32").get<uint32_t>());
    for (const auto& i : key.at("inputs")) b.emplace_back(i.at("bytes").get<uint64_t>(), i.at("crc32").get<uint32_t>());
    if (a != b)
      return "it was made from " + describe_inputs(old.at("inputs")) + "; this run reads " +
             describe_inputs(key.at("inputs"));
    const nlohmann::json &ot = old.at("tokenizer"), &nt = key.at("tokenizer");
    if (ot.value("trained_vocab_size", 0) != nt.value("trained_vocab_size", 0) ||
        ot.value("fingerprint", "") != nt.value("fingerprint", ""))
      return "it was tokenized with " + describe_tokenizer(ot) + "; this run asks for " + describe_tokenizer(nt);
    const std::string made = old.at("made").get<std::string>();
    if (nt.contains("trained_vocab_size")) {
      *cached_tokenizer = Tokenizer::load_hf((dir / kTokenizerFile).string());
      if (hex64(cached_tokenizer->fingerprint()) != made)
        return (dir / kTokenizerFile).string() + " changed after the cache was made";
    } else if (nt.at("fingerprint") != made) {
      return "its record is inconsistent";
    }
    if (hex64(TokenShard((dir / kShardFile).string()).tokenizer().fingerprint) != made)
      return (dir / kShardFile).string() + " was not made by the cache's tokenizer";
  } catch (const std::exception& e) {
    return std::string("it is unreadable or damaged (") + e.what() + ")";
  }
  return "";
}

void write_record(const fs::path& dir, const nlohmann::json& record) {
  const fs::path path = dir / kKeyFile, tmp = dir / (std::string(kKeyFile) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << record.dump(2) << "\n";
    f.flush();
    DSCPP_CHECK(f.good(), "cannot write ", tmp.string());
  }
  fs::rename(tmp, path);
}

// Refuses shards made by another tokenizer than `tok` (Note [Data cache key] for the record they carry).
void check_shards_tokenizer(const std::vector<std::string>& shards, const Tokenizer& tok, const std::string& tok_path,
                            std::ostream* log) {
  const uint64_t fp = tok.fingerprint();
  std::vector<std::string> unrecorded;
  for (const auto& p : shards) {
    TokenShard s(p);
    const ShardTokenizer& made = s.tokenizer();
    const std::string by = made.fingerprint ? "tokenizer " + made.name + " (fingerprint " + hex64(made.fingerprint) + ")"
                                            : "a tokenizer it does not record";
    if (s.vocab_size() != tok.vocab_size() || (made.fingerprint && made.fingerprint != fp))
      DSCPP_FAIL("--data ", p, " was made by ", by, " with ", s.vocab_size(), " tokens, but --tokenizer ", tok_path,
                 " is another tokenizer (fingerprint ", hex64(fp), ", ", tok.vocab_size(),
                 " tokens): pass the tokenizer that made the shards, or re-tokenize the text with `dscpp tokenize "
                 "--tokenizer ", tok_path, " -o DIR TEXT...`");
    if (!made.fingerprint) unrecorded.push_back(p);
  }
  if (log && !unrecorded.empty())
    *log << "note: " << unrecorded.size() << " token shard(s) (" << unrecorded.front()
         << (unrecorded.size() > 1 ? ", ..." : "") << ") do not record the tokenizer that made them (shard format "
         << "version 1): only their vocabulary size was checked against --tokenizer " << tok_path
         << "; `dscpp tokenize` again to record it" << std::endl;
}

}  // namespace

Tokenizer load_tokenizer_file(const std::string& path) {
  if (fs::path(path).filename() == "vocab.json")
    return Tokenizer::load_gpt2(path, (fs::path(path).parent_path() / "merges.txt").string());
  return Tokenizer::load_hf(path);
}

TrainData prepare_train_data(const TrainDataRequest& req, std::ostream* log) {
  std::vector<std::string> texts, shards;
  for (const auto& p : req.data) (is_shard(p) ? shards : texts).push_back(p);
  if (!texts.empty() && !shards.empty()) DSCPP_FAIL("--data: give token shards (*.bin) or text files, not both");
  TrainData d;
  const fs::path dir = req.cache_dir;
  fs::create_directories(dir);
  if (!req.tokenizer.empty()) {
    d.tokenizer = load_tokenizer_file(req.tokenizer);
    d.tokenizer_path = req.tokenizer;
    if (fs::path(req.tokenizer).filename() == "vocab.json") {  // checkpoints carry a tokenizer.json
      d.tokenizer_path = (dir / "tokenizer_from_vocab.json").string();
      d.tokenizer.save_hf(d.tokenizer_path);
    }
  }
  if (!shards.empty()) {
    if (req.tokenizer.empty()) DSCPP_FAIL("--data with token shards needs --tokenizer (the one that made them)");
    check_shards_tokenizer(shards, d.tokenizer, req.tokenizer, log);
    d.shards = shards;
    return d;
  }

  TextInputs in = read_inputs(texts);
  const bool trained = req.tokenizer.empty();
  nlohmann::json key = {{"format", "dscpp-data-cache"}, {"version", kCacheVersion}, {"shard_version", kShardVersion},
                        {"inputs", in.key}};
  if (trained) key["tokenizer"] = {{"trained_vocab_size", req.vocab_size}};
  else key["tokenizer"] = {{"name", req.tokenizer}, {"fingerprint", hex64(d.tokenizer.fingerprint())}};
  const fs::path shard = dir / kShardFile;
  d.shards = {shard.string()};
  if (trained) d.tokenizer_path = (dir / kTokenizerFile).string();

  Tokenizer cached;
  const std::string why = stale_reason(dir, key, &cached);
  if (why.empty()) {
    if (trained) d.tokenizer = std::move(cached);
    return d;
  }
  const bool first_build = !fs::exists(dir / kKeyFile) && !fs::exists(shard) && !fs::exists(dir / kTokenizerFile);
  if (log && !first_build) *log << "data cache " << dir.string() << ": " << why << "; rebuilding it" << std::endl;
  fs::remove(dir / kKeyFile);
  if (trained) {
    auto t0 = Clock::now();
    std::string joined;
    for (const auto& doc : in.docs) joined += doc, joined += '\n';
    if (log) {
      char mib[32];
      std::snprintf(mib, sizeof mib, "%.1f MiB", double(joined.size()) / double(1 << 20));
      *log << "training a " << req.vocab_size << "-token BPE tokenizer on " << mib << " of text..." << std::endl;
    }
    d.tokenizer = Tokenizer::train(joined, req.vocab_size);
    d.tokenizer.save_hf(d.tokenizer_path);
    if (log)
      *log << "  tokenizer: " << d.tokenizer.vocab_size() << " tokens in "
           << std::chrono::duration<double>(Clock::now() - t0).count() << " s -> " << d.tokenizer_path << std::endl;
  }
  auto t0 = Clock::now();
  std::vector<int32_t> toks = tokenize_documents(d.tokenizer, in.docs);
  write_token_shard(shard.string(), toks, d.tokenizer.vocab_size(), {d.tokenizer.fingerprint(), d.tokenizer_path});
  if (log)
    *log << "  tokenized " << in.docs.size() << " documents into " << toks.size() << " tokens in "
         << std::chrono::duration<double>(Clock::now() - t0).count() << " s -> " << shard.string() << std::endl;
  key["made"] = hex64(d.tokenizer.fingerprint());
  write_record(dir, key);
  return d;
}

}  // namespace dscpp
