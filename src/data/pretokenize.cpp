// GPT-2 pre-tokenisation scanner; the regex and the limits of our character classes are in pretokenize.h.
#include "dscpp/data/pretokenize.h"

#include <unicode/uchar.h>

namespace dscpp {
namespace detail {

static CharClass classify(char32_t c) {
  if (c < 128) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::letter;
    if (c >= '0' && c <= '9') return CharClass::number;
    if (c == ' ' || (c >= 0x09 && c <= 0x0d)) return CharClass::space;
    return CharClass::other;
  }
  UChar32 u = UChar32(c);
  if (u_isUWhiteSpace(u)) return CharClass::space;
  uint32_t mask = U_GET_GC_MASK(u);
  if (mask & U_GC_L_MASK) return CharClass::letter;
  if (mask & U_GC_N_MASK) return CharClass::number;
  return CharClass::other;
}

int next_char(std::string_view s, size_t i, CharClass& cls, char32_t& cp) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  int len = 0;
  char32_t c = 0, min = 0;
  if (b0 < 0x80) { cp = b0; cls = classify(b0); return 1; }
  if (b0 >= 0xc2 && b0 <= 0xdf) { len = 2; c = b0 & 0x1f; min = 0x80; }
  else if (b0 >= 0xe0 && b0 <= 0xef) { len = 3; c = b0 & 0x0f; min = 0x800; }
  else if (b0 >= 0xf0 && b0 <= 0xf4) { len = 4; c = b0 & 0x07; min = 0x10000; }
  bool ok = len > 0 && i + len <= s.size();
  for (int k = 1; ok && k < len; k++) {
    unsigned char b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0) != 0x80) ok = false;
    c = (c << 6) | (b & 0x3f);
  }
  if (ok && (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))) ok = false;
  if (!ok) { cp = b0; cls = CharClass::other; return 1; }  // invalid byte: one "other" character
  cp = c;
  cls = classify(c);
  return len;
}

// End of the run of characters of class `want` starting at i.
static size_t run_end(std::string_view s, size_t i, CharClass want) {
  CharClass cls;
  char32_t cp;
  while (i < s.size()) {
    int n = next_char(s, i, cls, cp);
    if (cls != want) break;
    i += n;
  }
  return i;
}

size_t pretoken_end(std::string_view s, size_t i) {
  CharClass cls;
  char32_t cp;
  int n = next_char(s, i, cls, cp);
  // 's|'t|'re|'ve|'m|'ll|'d
  if (cp == '\'' && i + 1 < s.size()) {
    char a = s[i + 1], b = i + 2 < s.size() ? s[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an ASCII space joins the run that follows it.
  if (cp == ' ' && i + 1 < s.size()) {
    CharClass next;
    char32_t ncp;
    next_char(s, i + 1, next, ncp);
    if (next != CharClass::space) return run_end(s, i + 1, next);
  }
  if (cls != CharClass::space) return run_end(s, i + n, cls);
  // '\s+(?!\S)' then '\s+': a whitespace run, less its last character when a non-space follows, so that a final
  // space can join the next word. A single whitespace character before a non-space is taken whole.
  size_t last = i, j = i;
  while (j < s.size()) {
    int m = next_char(s, j, cls, cp);
    if (cls != CharClass::space) break;
    last = j;
    j += m;
  }
  if (j == s.size() || last == i) return j;
  return last;
}

}  // namespace detail

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  pretokenize(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

}  // namespace dscpp
