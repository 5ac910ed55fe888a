// Pre-tokenisation with GPT-2's regex semantics, as a hand-written scanner over UTF-8 code points:
//   's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
// Classes: ASCII exactly; other code points by ICU general category (L*, N*) and the Unicode White_Space property
// for \s (so U+001C..U+001F, which Python's str.isspace() accepts, are "other" here; whether GPT-2's `regex`
// library agrees on those four was not checked). ICU's Unicode version may differ from the one GPT-2's regex
// library shipped, for recently added characters. Limits: a byte that is not part of valid UTF-8 (stray continuation,
// overlong, surrogate, truncated sequence) counts as one "other" character, so it joins ` ?[^\s\p{L}\p{N}]+` runs;
// GPT-2 itself never sees such bytes (its text is decoded first). The pieces always concatenate to the input.
#pragma once
#include <string_view>
#include <vector>

namespace dscpp {

// Calls f(std::string_view piece) for each pre-token in order.
template <typename F> void pretokenize(std::string_view text, F&& f);

std::vector<std::string_view> pretokenize(std::string_view text);

namespace detail {
enum class CharClass : unsigned char { letter, number, space, other };
// Decodes the code point at text[i] (strict UTF-8); returns its byte length (1 for an invalid byte) and class.
int next_char(std::string_view text, size_t i, CharClass& cls, char32_t& cp);
size_t pretoken_end(std::string_view text, size_t i);  // end of the pre-token starting at i
}  // namespace detail

template <typename F> void pretokenize(std::string_view text, F&& f) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = detail::pretoken_end(text, i);
    f(text.substr(i, j - i));
    i = j;
  }
}

}  // namespace dscpp
