// Byte-level BPE tokenizer (GPT-2 style): the 256 bytes are the base alphabet, so any byte string, including
// invalid UTF-8 and NUL, encodes and decode(encode(x)) == x. Text is first split into pre-tokens with GPT-2's or
// Llama 3's regex semantics (see pretokenize.h), then each pre-token is merged by rank. Reads GPT-2 vocab.json + merges.txt
// and Hugging Face tokenizer.json; saves tokenizer.json (HF format) so a trained tokenizer travels with checkpoints.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dscpp/data/pretokenize.h"

namespace dscpp {

inline constexpr const char* kEotToken = "<|endoftext|>";

class Tokenizer {
 public:
  Tokenizer() = default;

  // Learns vocab_size - 256 - special_tokens.size() merges on `text` (special-token strings in `text` are cut out,
  // never learned). Ids: 0..255 the bytes, then merges in order, then the special tokens. The first special token
  // is the end-of-text token. Stops early (smaller vocab) only when no pair occurs twice.
  static Tokenizer train(std::string_view text, int vocab_size,
                         const std::vector<std::string>& special_tokens = {kEotToken});
  // GPT-2 files. Any of `special_tokens` found in vocab.json becomes a special token.
  static Tokenizer load_gpt2(const std::string& vocab_json, const std::string& merges_txt,
                             const std::vector<std::string>& special_tokens = {kEotToken});
  // Hugging Face tokenizer.json with model.type BPE and a ByteLevel pre-tokenizer: alone (GPT-2's split), or in a
  // Sequence after a Split whose regex is GPT-2's or Llama 3's (pretokenize.h); any other regex, and
  // add_prefix_space=true, are refused. model.ignore_merges (Llama 3) is honoured. Every added_tokens entry becomes
  // a special token.
  static Tokenizer load_hf(const std::string& tokenizer_json);
  void save_hf(const std::string& tokenizer_json) const;  // atomic (temp file + rename)

  // encode() turns occurrences of special-token strings into their ids; encode_ordinary() treats all text as bytes.
  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& token_bytes(int32_t id) const;  // raw bytes of one token

  int vocab_size() const { return int(tokens_.size()); }
  // End of text: "<|endoftext|>" (GPT-2), else "<|end_of_text|>" (Llama 3), else the first special token; throws if
  // none. Generation stops at it.
  int32_t eot_id() const;
  // What starts a document and a prompt: "<|begin_of_text|>" (Llama 3), else eot_id() (GPT-2 puts EOT there).
  int32_t bos_id() const;
  // Where generation stops: eot_id(), and Llama 3's end of turn "<|eot_id|>" and "<|eom_id|>" when present.
  std::vector<int32_t> stop_ids() const;
  int32_t token_id(std::string_view bytes) const;  // -1 when absent
  int num_merges() const { return int(merges_.size()); }
  const std::vector<std::pair<std::string, int32_t>>& special_tokens() const { return specials_; }
  Pretokenizer pretokenizer() const { return pre_; }
  // 64 bits that identify what encoding depends on (tokens, merges, special tokens, pre-tokenizer), equal for the
  // same tokenizer read from tokenizer.json or from vocab.json + merges.txt. Token shards record it (shard.h).
  uint64_t fingerprint() const;

 private:
  struct Merge { int32_t rank, id; };
  struct Cache;
  void finish_init();  // builds the byte table and the merge index from tokens_ / merges_; validates
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;                          // id -> raw bytes
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::pair<int32_t, int32_t>> merges_;          // by rank: (left id, right id)
  std::unordered_map<uint64_t, Merge> merge_index_;          // (left << 32 | right) -> rank, merged id
  std::vector<std::pair<std::string, int32_t>> specials_;    // content, id
  int32_t byte_id_[256] = {};
  std::shared_ptr<Cache> cache_;                             // pre-token -> ids; shared by copies (immutable data)
  Pretokenizer pre_ = Pretokenizer::gpt2;
  bool ignore_merges_ = false;                               // a pre-token in the vocab is one token (HF BPE)
  std::vector<bool> is_special_;                             // by id
};

// GPT-2's bytes_to_unicode: byte b <-> one printable code point, as vocab.json / merges.txt spell tokens.
std::string bytes_to_unicode_str(std::string_view bytes);   // raw bytes -> UTF-8 of the mapped code points
bool unicode_str_to_bytes(std::string_view text, std::string& out);  // inverse; false if a char is not in the map

}  // namespace dscpp
