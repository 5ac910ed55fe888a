// BPE training on pre-token counts.
//
// Note [Incremental pair counts]: each distinct pre-token ("word") is a symbol list with a count. pair_count holds
// how often each adjacent pair occurs (weighted by word count) and pair_words which words hold it. A merge of (a, b)
// touches only the words listed for (a, b): we subtract their pairs, merge, and add their pairs back. Pairs not
// involving the new token can only lose counts, so a max-heap with lazy entries works: a popped entry whose count
// is stale is pushed back with its current count. Ties go to the smaller (left, right) ids so training is
// deterministic.
#include <algorithm>
#include <queue>

#include "dscpp/core/check.h"
#include "dscpp/data/pretokenize.h"
#include "dscpp/data/tokenizer.h"

namespace dscpp {

namespace {
struct Word {
  std::vector<int32_t> sym;
  int64_t count;
};
uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
}  // namespace

Tokenizer Tokenizer::train(std::string_view text, int vocab_size, const std::vector<std::string>& special_tokens) {
  const int n_special = int(special_tokens.size());
  DSCPP_CHECK(vocab_size >= 256 + n_special, "vocab_size ", vocab_size, " is below 256 bytes + ", n_special,
              " special tokens");
  for (auto& s : special_tokens) DSCPP_CHECK(!s.empty(), "special tokens must not be empty");

  // Count pre-tokens, cutting special-token strings out of the text.
  std::unordered_map<std::string_view, int64_t> counts;
  while (!text.empty()) {
    size_t cut = std::string_view::npos, cut_len = 0;
    for (auto& s : special_tokens) {
      size_t at = text.find(s);
      if (at < cut) { cut = at; cut_len = s.size(); }
    }
    pretokenize(text.substr(0, cut), [&](std::string_view w) { counts[w]++; });
    if (cut == std::string_view::npos) break;
    text.remove_prefix(cut + cut_len);
  }
  std::vector<Word> words;
  words.reserve(counts.size());
  for (auto& [w, c] : counts) {
    if (w.size() < 2) continue;
    Word word{{}, c};
    for (unsigned char ch : w) word.sym.push_back(ch);
    words.push_back(std::move(word));
  }
  // Word order only affects pair_words order, not the result; sort anyway so runs are reproducible bit for bit.
  std::sort(words.begin(), words.end(), [](const Word& x, const Word& y) { return x.sym < y.sym; });

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  for (int32_t wi = 0; wi < int32_t(words.size()); wi++) {
    auto& s = words[wi].sym;
    for (size_t i = 0; i + 1 < s.size(); i++) {
      pair_count[key(s[i], s[i + 1])] += words[wi].count;
      pair_words[key(s[i], s[i + 1])].push_back(wi);
    }
  }
  struct Entry { int64_t count; uint64_t pair; };
  auto less = [](const Entry& x, const Entry& y) { return x.count != y.count ? x.count < y.count : x.pair > y.pair; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(less)> heap(less);
  for (auto& [p, c] : pair_count) heap.push({c, p});

  Tokenizer t;
  std::unordered_map<std::string, int32_t> ids;  // two merges can spell the same bytes: (a, bc) and (ab, c)
  for (int b = 0; b < 256; b++) {
    t.tokens_.push_back(std::string(1, char(b)));
    ids[t.tokens_.back()] = b;
  }
  const size_t n_tokens = size_t(vocab_size - n_special);
  while (t.tokens_.size() < n_tokens && !heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    int64_t cur = pair_count[e.pair];
    if (cur != e.count) {
      if (cur > 0) heap.push({cur, e.pair});
      continue;
    }
    if (cur < 2) break;  // merging a pair seen once does not compress anything worth a vocab slot
    int32_t a = int32_t(e.pair >> 32), b = int32_t(e.pair & 0xffffffffu);
    std::string bytes = t.tokens_[a] + t.tokens_[b];
    auto [it, is_new] = ids.emplace(bytes, int32_t(t.tokens_.size()));
    int32_t id = it->second;
    if (is_new) t.tokens_.push_back(std::move(bytes));
    t.merges_.push_back({a, b});

    std::vector<int32_t> where = std::move(pair_words[e.pair]);
    pair_words.erase(e.pair);
    std::sort(where.begin(), where.end());
    where.erase(std::unique(where.begin(), where.end()), where.end());
    std::vector<uint64_t> touched;  // pairs with the new token, pushed once with their final counts
    for (int32_t wi : where) {
      auto& s = words[wi].sym;
      int64_t c = words[wi].count;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; i++) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;  // stale listing
      for (size_t i = 0; i + 1 < s.size(); i++) pair_count[key(s[i], s[i + 1])] -= c;
      std::vector<int32_t> merged;
      merged.reserve(s.size());
      for (size_t i = 0; i < s.size(); i++) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) { merged.push_back(id); i++; }
        else merged.push_back(s[i]);
      }
      s = std::move(merged);
      for (size_t i = 0; i + 1 < s.size(); i++) {
        uint64_t k = key(s[i], s[i + 1]);
        pair_count[k] += c;
        if (s[i] == id || s[i + 1] == id) { pair_words[k].push_back(wi); touched.push_back(k); }
      }
    }
    pair_count.erase(e.pair);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) heap.push({pair_count[k], k});
  }
  for (auto& s : special_tokens) {
    t.specials_.push_back({s, int32_t(t.tokens_.size())});
    t.tokens_.push_back(s);
  }
  t.finish_init();
  return t;
}

}  // namespace dscpp
