// Pre-tokenisation with GPT-2's regex semantics, as a hand-written scanner over UTF-8 code points:
//   's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
// or Llama 3's (its tokenizer.json's Split pattern, kLlama3SplitRegex):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ |
//   \s+(?!\S) | \s+
// (the contractions fold case as Unicode does: ASCII, and U+017F long s for s).
// Classes: ASCII exactly; other code points by ICU general category (L*, N*) and the Unicode White_Space property
// for \s (so U+001C..U+001F, which Python's str.isspace() accepts, are "other" here; whether GPT-2's `regex`
// library agrees on those four was not checked). ICU's Unicode version may differ from the one GPT-2's regex
// library shipped, for recently added characters: against Hugging Face tokenizers 0.23 (Llama 3's split), 24 of
// 20,000 random strings of code points below U+3000 split differently, all at letters Unicode 16 added (U+1C89,
// U+1C8A), which ICU 72 (Unicode 15.0) does not know. Limits: a byte that is not part of valid UTF-8 (stray continuation,
// overlong, surrogate, truncated sequence) counts as one "other" character, so it joins ` ?[^\s\p{L}\p{N}]+` runs;
// GPT-2 itself never sees such bytes (its text is decoded first). The pieces always concatenate to the input.
#pragma once
#include <string_view>
#include <vector>

namespace dscpp {

enum class Pretokenizer : unsigned char { gpt2, llama3 };
// The Split regexes of Hugging Face tokenizer.json files that these scanners implement.
inline constexpr const char* kGpt2SplitRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
inline constexpr const char* kLlama3SplitRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Calls f(std::string_view piece) for each pre-token in order.
template <typename F> void pretokenize(std::string_view text, F&& f, Pretokenizer p = Pretokenizer::gpt2);

std::vector<std::string_view> pretokenize(std::string_view text, Pretokenizer p = Pretokenizer::gpt2);

namespace detail {
enum class CharClass : unsigned char { letter, number, space, other };
// Decodes the code point at text[i] (strict UTF-8); returns its byte length (1 for an invalid byte) and class.
int next_char(std::string_view text, size_t i, CharClass& cls, char32_t& cp);
size_t pretoken_end(std::string_view text, size_t i);         // end of the GPT-2 pre-token starting at i
size_t llama3_pretoken_end(std::string_view text, size_t i);  // end of the Llama 3 pre-token starting at i
}  // namespace detail

template <typename F> void pretokenize(std::string_view text, F&& f, Pretokenizer p) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = p == Pretokenizer::llama3 ? detail::llama3_pretoken_end(text, i) : detail::pretoken_end(text, i);
    f(text.substr(i, j - i));
    i = j;
  }
}

}  // namespace dscpp
