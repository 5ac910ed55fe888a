// Tokenizer: GPT-2 pre-tokenizer splits, exact encodings of hand-made GPT-2 and tokenizer.json files, byte-level
// round trips on arbitrary bytes, training on the built-in corpus, tokenizer.json save/load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dscpp/core/check.h"
#include "dscpp/core/rng.h"
#include "dscpp/data/corpus.h"
#include "dscpp/data/pretokenize.h"
#include "dscpp/data/tokenizer.h"
#include "scratch_dirs.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("dscpp_test_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(d);
  dscpp::test_fixtures::remove_when_tests_end(d.string());
  return d;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  for (auto p : pretokenize(s)) out.emplace_back(p);
  return out;
}

// Hand-made vocab: byte b has id (b + 100) % 256 (so nothing may assume id == byte), then the merges below.
int32_t byte_id(unsigned char b) { return (b + 100) % 256; }
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "c"}, {"a", "t"}, {"Ġc", "at"}, {"y", "z"}, {"x", "y"}};
nlohmann::json hand_vocab() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; b++) v[bytes_to_unicode_str(std::string(1, char(b)))] = byte_id(b);
  int id = 256;
  for (auto& [a, b] : kMerges) v[a + b] = id++;  // Ġt=256 he=257 Ġthe=258 in=259 Ġc=260 at=261 Ġcat=262 yz=263 xy=264
  return v;
}

// GPT-2 files in d: vocab.json (hand_vocab and the end-of-text token) and merges.txt with the first n of kMerges.
void write_hand_gpt2_files(const fs::path& d, size_t n = kMerges.size()) {
  nlohmann::json vocab = hand_vocab();
  vocab["<|endoftext|>"] = 265;
  write_text(d / "vocab.json", vocab.dump());
  std::string merges = "#version: 0.2\n";
  for (size_t i = 0; i < n; i++) merges += kMerges[i].first + " " + kMerges[i].second + "\n";
  write_text(d / "merges.txt", merges);
}

const Tokenizer& corpus_tokenizer() {  // trained once, shared by the tests that need a realistic vocab
  static const Tokenizer t = Tokenizer::train(default_corpus_text(), 2048);
  return t;
}

std::string random_bytes(Rng& rng, size_t n) {
  static const char* snippets[] = {"\xff\xfe", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf8\x88\x80\x80\x80",
                                   "" /* NUL, below */, "          ", "\n\n\n", "\t \r\n",
                                   "Привет мир", "你好，世界", "١٢٣ ٤", "café naïve", "it's we'll",
                                   "\xe3\x80\x80", "<|endoftext|>"};
  std::string s;
  while (s.size() < n) {
    uint32_t k = rng.next_u32() % 4;
    if (k == 0) {
      size_t which = rng.below(std::size(snippets));
      s += which == 5 ? std::string(1, '\0') : std::string(snippets[which]);
    } else if (k == 1) {
      s += std::string(rng.below(300), ' ');
    } else {
      for (int i = 0, m = int(rng.below(20)); i < m; i++) s += char(rng.next_u32() & 0xff);
    }
  }
  return s;
}

}  // namespace

TEST(Pretokenize, MatchesGpt2Regex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("I'm  here\n\nnow"), (V{"I", "'m", " ", " here", "\n", "\n", "now"}));
  EXPECT_EQ(split("a   "), (V{"a", "   "}));
  EXPECT_EQ(split("x\ty"), (V{"x", "\t", "y"}));
  EXPECT_EQ(split("don't we'll they're I've"), (V{"don", "'t", " we", "'ll", " they", "'re", " I", "'ve"}));
  EXPECT_EQ(split("DON'T"), (V{"DON", "'", "T"}));  // contractions are case-sensitive in GPT-2
  EXPECT_EQ(split("hello!!! 123abc"), (V{"hello", "!!!", " 123", "abc"}));
  EXPECT_EQ(split("  !?"), (V{" ", " !?"}));
  EXPECT_EQ(split("café ναι 你好 ١٢٣ ½"), (V{"café", " ναι", " 你好", " ١٢٣", " ½"}));
  EXPECT_EQ(split("x\u3000y"), (V{"x", "\u3000", "y"}));  // U+3000 is Unicode white space
  EXPECT_EQ(split("a\xff" "b\xfe\xfd"), (V{"a", "\xff", "b", "\xfe\xfd"}));  // invalid bytes are "other"
  EXPECT_EQ(split("\xc3\xa9t\xc3"), (V{"\xc3\xa9t", "\xc3"}));             // é is a letter; lone lead byte is not
}

// Llama 3's split (Note in pretokenize.h) against Hugging Face tokenizers' own splits of 628 strings
// (tests/data/llama3_pretokenize.json, made by tests/data/gen_llama3_pretokenize.py): contractions in any case,
// digit groups of three, punctuation that joins the letters after it, CR/LF runs, Unicode letters, numbers and spaces.
TEST(Pretokenize, MatchesLlama3RegexAsHuggingFaceSplitsIt) {
  std::ifstream f(std::string(DSCPP_SOURCE_DIR) + "/tests/data/llama3_pretokenize.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("regex").get<std::string>(), kLlama3SplitRegex);
  int checked = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    std::vector<std::string> got;
    for (auto p : pretokenize(text, Pretokenizer::llama3)) got.emplace_back(p);
    EXPECT_EQ(got, c.at("pieces").get<std::vector<std::string>>()) << "text: " << nlohmann::json(text).dump();
    checked++;
  }
  EXPECT_GT(checked, 600);
}

TEST(Tokenizer, BytesToUnicodeMatchesGpt2) {
  EXPECT_EQ(bytes_to_unicode_str(" "), "\u0120");   // Ġ
  EXPECT_EQ(bytes_to_unicode_str("\n"), "\u010a");  // Ċ
  EXPECT_EQ(bytes_to_unicode_str(std::string(1, '\0')), "\u0100");
  EXPECT_EQ(bytes_to_unicode_str("\xad"), "\u0143");  // the last unprintable byte
  EXPECT_EQ(bytes_to_unicode_str("a~\xa1\xff"), "a~\u00a1\u00ff");
  std::string all, back;
  for (int b = 0; b < 256; b++) all += char(b);
  ASSERT_TRUE(unicode_str_to_bytes(bytes_to_unicode_str(all), back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(unicode_str_to_bytes("\u4f60", back));
}

TEST(Tokenizer, Gpt2FilesExactEncoding) {
  fs::path d = temp_dir();
  write_hand_gpt2_files(d);
  Tokenizer t = Tokenizer::load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string());
  EXPECT_EQ(t.vocab_size(), 266);
  EXPECT_EQ(t.eot_id(), 265);
  auto B = [](char c) { return byte_id(static_cast<unsigned char>(c)); };
  // "the" -> t he; " cat" -> Ġcat (via Ġc, at); " in" -> Ġ in; " the" -> Ġthe; " hat" -> Ġ h at; "'s" -> ' s
  std::vector<int32_t> want = {B('t'), 257, 262, B(' '), 259, 258, B(' '), B('h'), 261, B('\''), B('s')};
  EXPECT_EQ(t.encode("the cat in the hat's"), want);
  // x y z: (y z) has rank 7, (x y) rank 8, so y z merges first.
  EXPECT_EQ(t.encode("xyz"), (std::vector<int32_t>{B('x'), 263}));
  EXPECT_EQ(t.encode("a<|endoftext|>b"), (std::vector<int32_t>{B('a'), 265, B('b')}));
  EXPECT_EQ(t.encode_ordinary("<|"), (std::vector<int32_t>{B('<'), B('|')}));
  EXPECT_EQ(t.decode(want), "the cat in the hat's");
}

TEST(Tokenizer, HfJsonExactEncodingBothMergeForms) {
  fs::path d = temp_dir();
  for (bool list_form : {false, true}) {
    nlohmann::json merges = nlohmann::json::array();
    // Reverse the x/y/z order relative to the GPT-2 test: here (x y) outranks (y z).
    auto ms = kMerges;
    std::swap(ms[7], ms[8]);
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; b++) vocab[bytes_to_unicode_str(std::string(1, char(b)))] = byte_id(b);
    int id = 256;
    for (auto& [a, b] : ms) {
      vocab[a + b] = id++;
      merges.push_back(list_form ? nlohmann::json::array({a, b}) : nlohmann::json(a + " " + b));
    }
    nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", {{{"id", 265}, {"content", "<|endoftext|>"}, {"special", true}}}},  // not in model.vocab
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    write_text(d / "tokenizer.json", j.dump());
    Tokenizer t = Tokenizer::load_hf((d / "tokenizer.json").string());
    auto B = [](char c) { return byte_id(static_cast<unsigned char>(c)); };
    EXPECT_EQ(t.vocab_size(), 266);
    EXPECT_EQ(t.eot_id(), 265);
    EXPECT_EQ(t.bos_id(), 265) << "GPT-2 starts documents with EOT";
    EXPECT_EQ(t.encode("xyz<|endoftext|> the"), (std::vector<int32_t>{263, B('z'), 265, 258})) << list_form;
  }
}

// A tokenizer.json in Llama 3's form: Split by Llama 3's regex, ByteLevel without its own regex, ignore_merges. The
// split decides the ids (a merge across a Llama 3 boundary is not used), a pre-token in the vocab is taken whole,
// and save_hf writes the same pre-tokenizer back. Another Split regex is refused by name.
TEST(Tokenizer, Llama3StyleJsonSplitsLikeLlama3AndIgnoresMerges) {
  fs::path d = temp_dir();
  nlohmann::json vocab = hand_vocab(), merges = nlohmann::json::array();
  for (auto& [a, b] : kMerges) merges.push_back(a + " " + b);
  merges.push_back("Ġ 1");
  vocab["Ġ1"] = 265;
  vocab["xyz"] = 266;  // no merge makes it: only ignore_merges finds it
  auto make = [&](const std::string& regex, bool ignore_merges) {
    nlohmann::json pre = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    nlohmann::json j = {{"version", "1.0"},
                        {"added_tokens", {{{"id", 267}, {"content", "<|begin_of_text|>"}, {"special", true}},
                                          {{"id", 268}, {"content", "<|end_of_text|>"}, {"special", true}},
                                          {{"id", 269}, {"content", "<|eot_id|>"}, {"special", true}}}},
                        {"pre_tokenizer", pre},
                        {"model", {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab},
                                   {"merges", merges}}}};
    write_text(d / "tokenizer.json", j.dump());
    return Tokenizer::load_hf((d / "tokenizer.json").string());
  };
  auto B = [](char c) { return byte_id(static_cast<unsigned char>(c)); };
  const Tokenizer l3 = make(kLlama3SplitRegex, true);
  EXPECT_EQ(l3.pretokenizer(), Pretokenizer::llama3);
  EXPECT_EQ(l3.bos_id(), 267) << "<|begin_of_text|> starts documents and prompts";
  EXPECT_EQ(l3.eot_id(), 268) << "generation stops at <|end_of_text|>";
  EXPECT_EQ(l3.stop_ids(), (std::vector<int32_t>{268, 269})) << "and at the end of an instruct turn, <|eot_id|>";
  const std::vector<int32_t> want{267, 266, B(' '), B('1'), B('2'), B('3'), B('4'), B('5')};  // xyz| |123|45
  EXPECT_EQ(l3.encode("<|begin_of_text|>xyz 12345"), want);
  const Tokenizer g2 = make(kGpt2SplitRegex, false);  // xyz| 12345, merged by rank (yz outranks xy)
  EXPECT_EQ(g2.encode("<|begin_of_text|>xyz 12345"),
            (std::vector<int32_t>{267, B('x'), 263, 265, B('2'), B('3'), B('4'), B('5')}));
  l3.save_hf((d / "saved.json").string());
  const Tokenizer back = Tokenizer::load_hf((d / "saved.json").string());
  EXPECT_EQ(back.pretokenizer(), Pretokenizer::llama3);
  EXPECT_EQ(back.encode("<|begin_of_text|>xyz 12345"), want);
  try {
    make("\\w+|\\s+", false);
    ADD_FAILURE() << "an unknown Split regex was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\\w+|\\s+"), std::string::npos) << e.what();
  }
}

// A byte-level BPE in Llama 3's form trained by Hugging Face tokenizers on the fortunes, and that library's own ids
// for 253 texts (tests/data/gen_llama3_tokenizer.py): loading its tokenizer.json gives the same ids.
TEST(Tokenizer, Llama3StyleTokenizerEncodesAsHuggingFace) {
  const std::string dir = std::string(DSCPP_SOURCE_DIR) + "/tests/data/";
  const Tokenizer t = Tokenizer::load_hf(dir + "llama3_style_tokenizer.json");
  EXPECT_EQ(t.pretokenizer(), Pretokenizer::llama3);
  EXPECT_EQ(t.vocab_size(), 1200);
  std::ifstream f(dir + "llama3_style_encodings.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  int checked = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(t.encode_ordinary(text), c.at("ids").get<std::vector<int32_t>>()) << nlohmann::json(text).dump();
    EXPECT_EQ(t.decode(t.encode_ordinary(text)), text);
    checked++;
  }
  EXPECT_EQ(checked, 253);
}

TEST(Tokenizer, BadFilesNameTheProblem) {
  fs::path d = temp_dir();
  write_text(d / "vocab.json", hand_vocab().dump());
  write_text(d / "merges.txt", "#version: 0.2\nĠ t\nq Ġzz\n");
  try {
    Tokenizer::load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Ġzz"), std::string::npos) << e.what();
  }
  nlohmann::json j = {{"model", {{"type", "WordPiece"}, {"vocab", hand_vocab()}}}};
  write_text(d / "bad.json", j.dump());
  EXPECT_THROW(Tokenizer::load_hf((d / "bad.json").string()), Error);
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  fs::path d = temp_dir();
  write_text(d / "vocab.json", hand_vocab().dump());
  std::string merges;
  for (auto& [a, b] : kMerges) merges += a + " " + b + "\n";
  write_text(d / "merges.txt", merges);
  Tokenizer hand = Tokenizer::load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string());
  Rng rng(42);
  for (int i = 0; i < 200; i++) {
    std::string s = random_bytes(rng, rng.below(2000));
    for (const Tokenizer* t : {static_cast<const Tokenizer*>(&hand), &corpus_tokenizer()}) {
      std::vector<int32_t> ids = t->encode(s);
      ASSERT_EQ(t->decode(ids), s) << "case " << i << " (seed 42)";
      ASSERT_EQ(t->decode(t->encode_ordinary(s)), s) << "case " << i;
    }
  }
  std::string all;
  for (int b = 0; b < 256; b++) all += char(b);
  EXPECT_EQ(corpus_tokenizer().decode(corpus_tokenizer().encode(all)), all);
  std::string spaces(100000, ' ');
  EXPECT_EQ(corpus_tokenizer().decode(corpus_tokenizer().encode(spaces)), spaces);
}

TEST(Tokenizer, TrainHitsVocabSizeAndCompressesEnglish) {
  std::string text = default_corpus_text();
  auto t0 = std::chrono::steady_clock::now();
  Tokenizer t = Tokenizer::train(text, 2048);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(t.vocab_size(), 2048);
  EXPECT_EQ(t.num_merges(), 2048 - 256 - 1);
  EXPECT_EQ(t.token_bytes(t.eot_id()), kEotToken);
  EXPECT_EQ(t.eot_id(), 2047);
  // Deterministic: the shared tokenizer was trained separately on the same text.
  for (int i = 0; i < t.vocab_size(); i++) ASSERT_EQ(t.token_bytes(i), corpus_tokenizer().token_bytes(i)) << i;
  std::string sample = text.substr(text.size() / 3, 300000);
  auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = t.encode(sample);
  double enc = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_LT(ids.size(), sample.size() / 2) << "tokens " << ids.size() << " for " << sample.size() << " bytes";
  EXPECT_EQ(t.decode(ids), sample);
  std::printf("train %.1f MB -> vocab 2048: %.2f s; encode 300 KB: %.3f s, %.2f bytes/token\n", text.size() / 1e6,
              secs, enc, double(sample.size()) / double(ids.size()));
}

TEST(Tokenizer, SaveLoadHfReproducesEncodings) {
  fs::path d = temp_dir();
  const Tokenizer& t = corpus_tokenizer();
  t.save_hf((d / "trained.json").string());
  Tokenizer u = Tokenizer::load_hf((d / "trained.json").string());
  ASSERT_EQ(u.vocab_size(), t.vocab_size());
  EXPECT_EQ(u.num_merges(), t.num_merges());
  EXPECT_EQ(u.eot_id(), t.eot_id());
  for (int i = 0; i < t.vocab_size(); i++) ASSERT_EQ(u.token_bytes(i), t.token_bytes(i)) << "token " << i;
  std::string text = default_corpus_text().substr(0, 200000);
  EXPECT_EQ(u.encode(text), t.encode(text));
  Rng rng(3);
  std::string junk = random_bytes(rng, 5000);
  EXPECT_EQ(u.encode(junk), t.encode(junk));
  EXPECT_EQ(u.fingerprint(), t.fingerprint());  // what shards record (shard.h): the same tokenizer, read back
  fs::remove_all(d);
}

// One merge, one token or one special token more or less is another tokenizer; the file format is not.
TEST(Tokenizer, FingerprintIdentifiesTheEncoding) {
  fs::path d = temp_dir();
  write_hand_gpt2_files(d);
  const Tokenizer gpt2 = Tokenizer::load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string());
  gpt2.save_hf((d / "tokenizer.json").string());
  EXPECT_EQ(Tokenizer::load_hf((d / "tokenizer.json").string()).fingerprint(), gpt2.fingerprint());
  write_hand_gpt2_files(d, kMerges.size() - 1);
  EXPECT_NE(Tokenizer::load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string()).fingerprint(),
            gpt2.fingerprint());
  const std::string text = default_corpus_text().substr(0, 20000);
  EXPECT_NE(Tokenizer::train(text, 300).fingerprint(), Tokenizer::train(text, 301).fingerprint());
  EXPECT_EQ(Tokenizer::train(text, 300).fingerprint(), Tokenizer::train(text, 300).fingerprint());
  fs::remove_all(d);
}
