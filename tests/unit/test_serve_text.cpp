// TextStream (serve/text_stream.h): text leaves only at UTF-8 boundaries and stop strings split across tokens are
// held back, then cut, whatever the split; stop ids from the tokenizer and generation_config.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <algorithm>
#include <unistd.h>

#include "dscpp/core/check.h"
#include "dscpp/serve/model_stops.h"
#include "dscpp/serve/text_stream.h"

using dscpp::serve::TextStream;

namespace {

bool valid_utf8_prefix_free(const std::string& s) { return dscpp::serve::utf8_incomplete_tail(s) == 0; }

// Feeds `text` cut at `cuts` (byte offsets), checks every emitted piece ends on a character boundary, returns all.
std::string feed(TextStream& s, const std::string& text, const std::vector<size_t>& cuts) {
  std::string out;
  size_t prev = 0;
  for (size_t c : cuts) {
    const std::string piece = s.push(text.substr(prev, c - prev));
    EXPECT_TRUE(valid_utf8_prefix_free(piece)) << "cut at " << c;
    out += piece;
    prev = c;
  }
  out += s.push(text.substr(prev));
  out += s.finish();
  return out;
}

}  // namespace

TEST(ServeText, MultiByteCharactersSplitAcrossTokensLeaveWhole) {
  const std::string text = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82!";  // café 日本 🙂!
  for (size_t a = 1; a < text.size(); a++)
    for (size_t b = a; b < text.size(); b++) {
      TextStream s;
      EXPECT_EQ(feed(s, text, {a, b}), text) << a << "," << b;
    }
  TextStream s;
  EXPECT_EQ(s.push("\xF0\x9F"), "");  // half an emoji waits
  EXPECT_EQ(s.push("\x99"), "");
  EXPECT_EQ(s.push("\x82x"), "\xF0\x9F\x99\x82x");
  EXPECT_EQ(s.push("\xE6"), "");
  EXPECT_EQ(s.finish(), "\xE6");  // the end passes an unfinished character on (JSON replaces it)
}

TEST(ServeText, StopStringsSplitAcrossTokensAreHeldThenCut) {
  const std::string text = "one two\n\nthree";
  for (size_t a = 1; a < text.size(); a++)
    for (size_t b = a; b < text.size(); b++) {
      TextStream s({"\n\n", "xyz"});
      EXPECT_EQ(feed(s, text, {a, b}), "one two") << a << "," << b;
      EXPECT_TRUE(s.stopped());
    }
  TextStream s({"END"});
  EXPECT_EQ(s.push("abc E"), "abc ");  // "E" may start END
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("x"), "ENx");        // ruled out: released
  EXPECT_EQ(s.push("EEN"), "E");        // "EN" still may
  EXPECT_EQ(s.push("D and more"), "");  // stopped: the rest is dropped
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "abc ENxE");
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.finish(), "");
}

TEST(ServeText, StopStringWithMultiByteCharacters) {
  const std::string text = "a\xC3\xA9\xE6\x97\xA5z";  // aé日z, stop "日"
  for (size_t a = 1; a < text.size(); a++) {
    TextStream s({"\xE6\x97\xA5"});
    EXPECT_EQ(feed(s, text, {a}), "a\xC3\xA9") << a;
  }
  TextStream none({"zz"});
  EXPECT_EQ(feed(none, "no stop here z", {3, 13}), "no stop here z");
  EXPECT_FALSE(none.stopped());
}

TEST(ServeText, StopIdsFromTokenizerAndGenerationConfig) {
  const dscpp::Tokenizer tok = dscpp::Tokenizer::train("some text to learn from, some text", 280,
                                                       {dscpp::kEotToken, "<|im_end|>", "<|x|>"});
  const auto dir = std::filesystem::temp_directory_path() / ("dscpp_serve_stops_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_EQ(dscpp::serve::model_stop_ids(tok, dir.string()), tok.stop_ids());  // no generation_config.json
  const int32_t im_end = tok.token_id("<|im_end|>"), x = tok.token_id("<|x|>");
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": [" << im_end << ", " << x << "]}";
  std::vector<int32_t> want = tok.stop_ids();
  want.push_back(im_end), want.push_back(x);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(dscpp::serve::model_stop_ids(tok, dir.string()), want);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": " << x << "}";
  EXPECT_EQ(dscpp::serve::model_stop_ids(tok, dir.string()).size(), tok.stop_ids().size() + 1);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": 100000}";
  EXPECT_THROW(dscpp::serve::model_stop_ids(tok, dir.string()), dscpp::Error);
  std::filesystem::remove_all(dir);
}
