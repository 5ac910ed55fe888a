// Tokenizer files: GPT-2 vocab.json + merges.txt, Hugging Face tokenizer.json (read and write), and GPT-2's
// bytes_to_unicode mapping those files spell tokens with.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dscpp/core/check.h"
#include "dscpp/data/tokenizer.h"

namespace dscpp {

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
struct ByteMap {
  char32_t to_cp[256];
  int16_t from_cp[512];
  ByteMap() {
    for (auto& x : from_cp) x = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) out += char(c);
  else if (c < 0x800) { out += char(0xc0 | (c >> 6)); out += char(0x80 | (c & 0x3f)); }
  else { out += char(0xe0 | (c >> 12)); out += char(0x80 | ((c >> 6) & 0x3f)); out += char(0x80 | (c & 0x3f)); }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DSCPP_CHECK(f.good(), "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json parse_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    DSCPP_FAIL(path, ": not valid JSON: ", e.what());
  }
}

// vocab (token spelled in bytes_to_unicode -> id) into an id-indexed table of raw bytes. `raw` gives ids whose text
// is taken literally (added tokens such as "<|endoftext|>").
std::vector<std::string> vocab_table(const nlohmann::json& vocab, const std::string& path,
                                     const std::map<int32_t, std::string>& raw) {
  DSCPP_CHECK(vocab.is_object(), path, ": vocab must be a JSON object of token -> id");
  std::vector<std::string> tokens(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (auto& [text, jid] : vocab.items()) {
    int64_t id = jid.get<int64_t>();
    DSCPP_CHECK(id >= 0 && id < int64_t(vocab.size()), path, ": token ", text, " has id ", id,
                " but ids must be 0..", vocab.size() - 1);
    DSCPP_CHECK(!seen[id], path, ": id ", id, " is used twice");
    seen[id] = true;
    auto r = raw.find(int32_t(id));
    if (r != raw.end()) tokens[id] = r->second;
    else if (!unicode_str_to_bytes(text, tokens[id])) tokens[id] = text;  // not byte-level spelled: keep as is
  }
  return tokens;
}

std::pair<std::string, std::string> split_merge(const std::string& line, const std::string& path, size_t n) {
  size_t sp = line.find(' ');
  DSCPP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == line.npos,
              path, ": merge ", n, " is \"", line, "\", expected two tokens separated by one space");
  return {line.substr(0, sp), line.substr(sp + 1)};
}

}  // namespace

std::string bytes_to_unicode_str(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_map().to_cp[b]);
  return out;
}

bool unicode_str_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    char32_t c;
    if (b < 0x80) { c = b; i += 1; }
    else if ((b & 0xe0) == 0xc0 && i + 1 < s.size()) { c = ((b & 0x1f) << 6) | (s[i + 1] & 0x3f); i += 2; }
    else return false;  // the map only uses code points below U+0144
    if (c >= 512 || byte_map().from_cp[c] < 0) return false;
    out += char(byte_map().from_cp[c]);
  }
  return true;
}

// The merge list names tokens by their spelling; `lookup` turns a spelled token into its id.
static std::pair<int32_t, int32_t> merge_ids(const std::unordered_map<std::string, int32_t>& spelled,
                                             const std::string& a, const std::string& b, const std::string& path,
                                             size_t n) {
  auto ia = spelled.find(a), ib = spelled.find(b);
  DSCPP_CHECK(ia != spelled.end() && ib != spelled.end(), path, ": merge ", n, " (", a, " ", b,
              ") names a token that is not in the vocab");
  return {ia->second, ib->second};
}

Tokenizer Tokenizer::load_gpt2(const std::string& vocab_json, const std::string& merges_txt,
                               const std::vector<std::string>& special_tokens) {
  nlohmann::json vocab = parse_json(vocab_json);
  Tokenizer t;
  std::map<int32_t, std::string> raw;
  for (auto& s : special_tokens)
    if (vocab.contains(s)) raw[vocab[s].get<int32_t>()] = s;
  t.tokens_ = vocab_table(vocab, vocab_json, raw);
  std::unordered_map<std::string, int32_t> spelled;
  for (auto& [text, jid] : vocab.items()) spelled[text] = jid.get<int32_t>();
  std::istringstream in(read_file(merges_txt));
  std::string line;
  for (size_t n = 0; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    auto [a, b] = split_merge(line, merges_txt, n);
    t.merges_.push_back(merge_ids(spelled, a, b, merges_txt, n));
    n++;
  }
  for (auto& s : special_tokens)
    if (vocab.contains(s)) t.specials_.push_back({s, vocab[s].get<int32_t>()});
  t.finish_init();
  return t;
}

Tokenizer Tokenizer::load_hf(const std::string& path) {
  nlohmann::json j = parse_json(path);
  DSCPP_CHECK(j.contains("model") && j["model"].is_object(), path, ": no \"model\" section");
  const auto& model = j["model"];
  std::string type = model.value("type", "BPE");
  DSCPP_CHECK(type == "BPE", path, ": model.type is ", type, ", only BPE is supported");
  // The pre-tokenizer must be byte-level: ByteLevel alone (its use_regex: GPT-2's split), or a Split by a regex we
  // implement, then ByteLevel without its own regex.
  bool byte_level = false, byte_level_regex = false;
  std::string split;  // the Split step's regex
  auto check_pre = [&](const nlohmann::json& p) {
    if (!p.is_object()) return;
    const std::string type = p.value("type", "");
    if (type == "ByteLevel") {
      byte_level = true;
      byte_level_regex = p.value("use_regex", true);
      DSCPP_CHECK(!p.value("add_prefix_space", false), path, ": ByteLevel add_prefix_space=true is not supported");
    } else if (type == "Split") {
      DSCPP_CHECK(split.empty(), path, ": more than one Split pre-tokenizer is not supported");
      const auto& pat = p.value("pattern", nlohmann::json::object());
      DSCPP_CHECK(pat.contains("Regex") && p.value("behavior", "") == "Isolated" && !p.value("invert", false), path,
                  ": a Split pre-tokenizer must have a Regex pattern, behavior Isolated and invert false");
      split = pat.at("Regex").get<std::string>();
    } else {
      DSCPP_FAIL(path, ": pre-tokenizer '", type, "' is not supported (ByteLevel, Split)");
    }
  };
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    const auto& pre = j["pre_tokenizer"];
    if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers"))
      for (auto& p : pre["pretokenizers"]) check_pre(p);
    else
      check_pre(pre);
  }
  DSCPP_CHECK(byte_level, path, ": not a byte-level BPE tokenizer (pre_tokenizer has no ByteLevel step)");
  Tokenizer t;
  if (!split.empty()) {
    DSCPP_CHECK(!byte_level_regex, path, ": a Split and ByteLevel's own regex (use_regex=true) together are not "
                "supported");
    DSCPP_CHECK(split == kGpt2SplitRegex || split == kLlama3SplitRegex, path, ": the Split regex '", split,
                "' is not one we implement (GPT-2's or Llama 3's)");
    t.pre_ = split == kLlama3SplitRegex ? Pretokenizer::llama3 : Pretokenizer::gpt2;
  } else {
    DSCPP_CHECK(byte_level_regex, path, ": ByteLevel with use_regex=false and no Split would not split the text; "
                "not supported");
  }
  t.ignore_merges_ = model.value("ignore_merges", false);
  std::map<int32_t, std::string> raw;
  if (j.contains("added_tokens"))
    for (auto& a : j["added_tokens"]) raw[a.at("id").get<int32_t>()] = a.at("content").get<std::string>();
  nlohmann::json vocab = model.at("vocab");
  for (auto& [id, content] : raw)  // added tokens need not be in model.vocab
    if (!vocab.contains(content) && id == int32_t(vocab.size())) vocab[content] = id;
  t.tokens_ = vocab_table(vocab, path, raw);
  std::unordered_map<std::string, int32_t> spelled;
  for (auto& [text, jid] : vocab.items()) spelled[text] = jid.get<int32_t>();
  size_t n = 0;
  for (auto& m : model.at("merges")) {
    std::pair<std::string, std::string> ab;
    if (m.is_string()) ab = split_merge(m.get<std::string>(), path, n);
    else {
      DSCPP_CHECK(m.is_array() && m.size() == 2, path, ": merge ", n, " must be \"a b\" or [a, b]");
      ab = {m[0].get<std::string>(), m[1].get<std::string>()};
    }
    t.merges_.push_back(merge_ids(spelled, ab.first, ab.second, path, n));
    n++;
  }
  for (auto& [id, content] : raw) t.specials_.push_back({content, id});
  std::sort(t.specials_.begin(), t.specials_.end(), [](auto& x, auto& y) { return x.second < y.second; });
  t.finish_init();
  return t;
}

void Tokenizer::save_hf(const std::string& path) const {
  DSCPP_CHECK(cache_, "save_hf on an empty tokenizer");
  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object(), merges = ojson::array(), added = ojson::array();
  std::vector<bool> special(tokens_.size(), false);
  for (auto& [s, id] : specials_) {
    special[id] = true;
    added.push_back({{"id", id}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  for (size_t i = 0; i < tokens_.size(); i++)
    vocab[special[i] ? tokens_[i] : bytes_to_unicode_str(tokens_[i])] = i;
  for (auto [a, b] : merges_) merges.push_back(bytes_to_unicode_str(tokens_[a]) + " " + bytes_to_unicode_str(tokens_[b]));
  ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  ojson pre = byte_level;
  if (pre_ == Pretokenizer::llama3) {
    ojson split = {{"type", "Split"}, {"pattern", {{"Regex", kLlama3SplitRegex}}}, {"behavior", "Isolated"},
                   {"invert", false}};
    ojson bl = byte_level;
    bl["use_regex"] = false;
    pre = {{"type", "Sequence"}, {"pretokenizers", ojson::array({split, bl})}};
  }
  ojson j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
             {"normalizer", nullptr}, {"pre_tokenizer", pre}, {"post_processor", byte_level},
             {"decoder", byte_level},
             {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
  if (ignore_merges_) j["model"]["ignore_merges"] = true;  // written only when set: older readers do not know it
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    DSCPP_CHECK(f.good(), "cannot write ", tmp);
    f << j.dump(1, ' ', false, ojson::error_handler_t::replace) << "\n";
    f.flush();
    DSCPP_CHECK(f.good(), "write failed: ", tmp);
  }
  DSCPP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

}  // namespace dscpp
