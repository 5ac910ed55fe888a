// Byte-level BPE: encode / decode and the merge index. Training is in bpe_train.cpp, file formats in
// tokenizer_io.cpp.
//
// Note [BPE merge order]: within one pre-token we repeatedly merge the adjacent pair of lowest merge rank, leftmost
// first among equal ranks (GPT-2's bpe() and HF tokenizers agree on this for merge lists where every merge's inputs
// are made by earlier merges). A heap of (rank, position) over a linked list of symbols makes a word O(n log n), so
// long runs (ASCII art, 10k spaces) stay cheap.
#include "dscpp/data/tokenizer.h"

#include <mutex>
#include <queue>

#include "dscpp/core/check.h"
#include "dscpp/data/pretokenize.h"

namespace dscpp {

struct Tokenizer::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

void Tokenizer::finish_init() {
  token_to_id_.clear();
  for (size_t i = 0; i < tokens_.size(); i++) {
    bool is_special = false;
    for (auto& s : specials_) is_special |= s.second == int32_t(i);
    // A special token whose text equals an ordinary token must not shadow it for byte merges.
    if (!is_special || !token_to_id_.count(tokens_[i])) token_to_id_.emplace(tokens_[i], int32_t(i));
  }
  for (int b = 0; b < 256; b++) {
    auto it = token_to_id_.find(std::string(1, char(b)));
    DSCPP_CHECK(it != token_to_id_.end(), "byte-level BPE vocab has no token for byte 0x", std::hex, b,
                " (every byte must be in the vocab)");
    byte_id_[b] = it->second;
  }
  merge_index_.clear();
  merge_index_.reserve(merges_.size() * 2);
  for (size_t r = 0; r < merges_.size(); r++) {
    auto [a, b] = merges_[r];
    auto it = token_to_id_.find(tokens_[a] + tokens_[b]);
    DSCPP_CHECK(it != token_to_id_.end(), "merge #", r, " (", bytes_to_unicode_str(tokens_[a]), " ",
                bytes_to_unicode_str(tokens_[b]), ") makes a token that is not in the vocab");
    merge_index_.emplace(pair_key(a, b), Merge{int32_t(r), it->second});  // first (lowest) rank wins
  }
  for (auto& s : specials_)
    DSCPP_CHECK(!s.first.empty() && s.second >= 0 && s.second < vocab_size(), "special token ", s.first, " has id ", s.second,
                " outside the vocab of ", vocab_size());
  is_special_.assign(tokens_.size(), false);
  for (auto& s : specials_) is_special_[size_t(s.second)] = true;
  cache_ = std::make_shared<Cache>();
}

uint64_t Tokenizer::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  };
  auto mix_int = [&](int64_t v) { mix(&v, sizeof v); };
  auto mix_str = [&](const std::string& s) { mix_int(int64_t(s.size())), mix(s.data(), s.size()); };
  mix_int(int64_t(pre_));
  mix_int(ignore_merges_);
  mix_int(int64_t(tokens_.size()));
  for (const auto& t : tokens_) mix_str(t);
  mix_int(int64_t(merges_.size()));
  for (auto [a, b] : merges_) mix_int(a), mix_int(b);
  for (const auto& [s, id] : specials_) mix_str(s), mix_int(id);
  return h;
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const size_t n = word.size();
  if (n == 1) { out.push_back(byte_id_[static_cast<unsigned char>(word[0])]); return; }
  if (ignore_merges_) {
    auto it = token_to_id_.find(std::string(word));
    if (it != token_to_id_.end() && !is_special_[size_t(it->second)]) { out.push_back(it->second); return; }
  }
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->words.find(std::string(word));
    if (it != cache_->words.end()) { out.insert(out.end(), it->second.begin(), it->second.end()); return; }
  }
  std::vector<int32_t> sym(n), prev(n), next(n);  // linked list; next == n marks the end, -1 a removed node
  for (size_t i = 0; i < n; i++) {
    sym[i] = byte_id_[static_cast<unsigned char>(word[i])];
    prev[i] = int32_t(i) - 1;
    next[i] = int32_t(i) + 1;
  }
  struct Cand { int32_t rank, pos, left, right; };
  auto later = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] >= int32_t(n)) return;
    auto it = merge_index_.find(pair_key(sym[pos], sym[next[pos]]));
    if (it != merge_index_.end()) heap.push({it->second.rank, pos, sym[pos], sym[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; i++) consider(int32_t(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t p = c.pos;
    if (next[p] < 0 || next[p] >= int32_t(n) || sym[p] != c.left || sym[next[p]] != c.right) continue;  // stale
    int32_t q = next[p];
    sym[p] = merge_index_.at(pair_key(c.left, c.right)).id;
    next[p] = next[q];
    if (next[q] < int32_t(n)) prev[next[q]] = p;
    next[q] = -1;
    consider(prev[p]);
    consider(p);
  }
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < int32_t(n); i = next[i]) ids.push_back(sym[i]);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->words.size() > (1u << 20)) cache_->words.clear();  // bound memory on huge, varied inputs
  cache_->words.emplace(std::string(word), std::move(ids));
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  DSCPP_CHECK(cache_, "encode on an empty tokenizer (load or train one first)");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  pretokenize(text, [&](std::string_view w) { encode_word(w, out); }, pre_);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  while (!text.empty()) {
    size_t best = std::string_view::npos, best_len = 0;
    int32_t best_id = -1;
    for (auto& [s, id] : specials_) {
      size_t at = text.find(s);
      if (at != std::string_view::npos && (at < best || (at == best && s.size() > best_len))) {
        best = at; best_len = s.size(); best_id = id;
      }
    }
    std::vector<int32_t> part = encode_ordinary(text.substr(0, best));
    out.insert(out.end(), part.begin(), part.end());
    if (best == std::string_view::npos) break;
    out.push_back(best_id);
    text.remove_prefix(best + best_len);
  }
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  DSCPP_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " outside the vocab of ", vocab_size());
  return tokens_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

int32_t Tokenizer::token_id(std::string_view bytes) const {
  auto it = token_to_id_.find(std::string(bytes));
  return it == token_to_id_.end() ? -1 : it->second;
}

int32_t Tokenizer::eot_id() const {
  for (const char* name : {kEotToken, "<|end_of_text|>"})
    for (auto& [s, id] : specials_)
      if (s == name) return id;
  DSCPP_CHECK(!specials_.empty(), "tokenizer has no end-of-text token (no special tokens)");
  return specials_.front().second;
}

std::vector<int32_t> Tokenizer::stop_ids() const {
  std::vector<int32_t> out{eot_id()};
  for (auto& [s, id] : specials_)
    if ((s == "<|eot_id|>" || s == "<|eom_id|>") && id != out.front()) out.push_back(id);
  return out;
}

int32_t Tokenizer::bos_id() const {
  for (auto& [s, id] : specials_)
    if (s == "<|begin_of_text|>") return id;
  return eot_id();
}

}  // namespace dscpp
