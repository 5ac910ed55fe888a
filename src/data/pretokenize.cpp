// GPT-2 and Llama 3 pre-tokenisation scanners; the regexes and the limits of our character classes are in
// pretokenize.h.
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

static size_t whitespace_end(std::string_view s, size_t i, bool crlf);

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
  return whitespace_end(s, i, /*crlf=*/false);
}

// The whitespace alternatives both schemes end with, at a whitespace character: '\s+(?!\S)' then '\s+' (a run, less
// its last character when a non-space follows, so that a final space can join the next word; a single whitespace
// character before a non-space is taken whole). With crlf (Llama 3), '\s*[\r\n]+' comes first: a run holding a
// CR or LF ends right after its last one.
static size_t whitespace_end(std::string_view s, size_t i, bool crlf) {
  CharClass cls;
  char32_t cp;
  size_t last = i, j = i, after_crlf = 0;
  while (j < s.size()) {
    int m = next_char(s, j, cls, cp);
    if (cls != CharClass::space) break;
    last = j;
    j += m;
    if (cp == '\r' || cp == '\n') after_crlf = j;
  }
  if (crlf && after_crlf) return after_crlf;
  if (j == s.size() || last == i) return j;
  return last;
}

size_t llama3_pretoken_end(std::string_view s, size_t i) {
  CharClass cls, next = CharClass::space;
  char32_t cp, ncp = 0;
  const int n = next_char(s, i, cls, cp);
  const bool more = i + n < s.size();
  int nn = 0;
  if (more) nn = next_char(s, i + n, next, ncp);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (cp == '\'' && more) {
    auto lower = [](char c) { return char(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c); };
    const char a = lower(s[i + 1]), b = i + 2 < s.size() ? lower(s[i + 2]) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    if (s.substr(i + 1, 2) == "\xC5\xBF") return i + 3;  // U+017F (long s) case-folds to s, as in Hugging Face's split
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+: letters, with one character before them that is none of CR, LF, letter, number.
  if (cls == CharClass::letter) return run_end(s, i + n, CharClass::letter);
  if (cls != CharClass::number && cp != '\r' && cp != '\n' && more && next == CharClass::letter)
    return run_end(s, i + n + nn, CharClass::letter);
  // \p{N}{1,3}
  if (cls == CharClass::number) {
    size_t j = i + n;
    for (int k = 1; k < 3 && j < s.size(); k++) {
      CharClass c;
      char32_t x;
      const int m = next_char(s, j, c, x);
      if (c != CharClass::number) break;
      j += m;
    }
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = cls == CharClass::other ? i : cp == ' ' && more && next == CharClass::other ? i + 1 : s.size() + 1;
  if (j <= s.size()) {
    j = run_end(s, j, CharClass::other);
    while (j < s.size() && (s[j] == '\r' || s[j] == '\n')) j++;
    return j;
  }
  return whitespace_end(s, i, /*crlf=*/true);
}

}  // namespace detail

std::vector<std::string_view> pretokenize(std::string_view text, Pretokenizer p) {
  std::vector<std::string_view> out;
  pretokenize(text, [&](std::string_view piece) { out.push_back(piece); }, p);
  return out;
}

}  // namespace dscpp
