// Token shard files: a 256-byte header then the tokens, little-endian.
//   header: magic "DSCPPTOK" | u32 version (2) | u32 bytes per token (2: uint16 when vocab <= 65536, else 4) |
//           u64 vocab size | u64 number of tokens | u32 CRC32 (zlib) of the payload |
//           u32 CRC32 of the 36 header bytes before it |
//           the tokenizer that made the tokens: u64 Tokenizer::fingerprint() (0: not recorded) |
//           its file name, NUL-padded to 204 bytes | u32 CRC32 of the 212 bytes from the fingerprint on
// Version 1 (zero padding where version 2 records the tokenizer) is still read, as made by an unrecorded tokenizer.
// Writes are atomic (temp file, fsync, rename); opening validates header, file size and checksum and names the
// file and the problem in the error.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dscpp {

inline constexpr size_t kShardHeaderBytes = 256;
inline constexpr uint32_t kShardVersion = 2;

// The tokenizer a shard's tokens were made with. Training checks it against the tokenizer it is given.
struct ShardTokenizer {
  uint64_t fingerprint = 0;  // Tokenizer::fingerprint(); 0 = not recorded (every version 1 shard)
  std::string name;          // where it was read from or saved to, for messages (truncated to 203 bytes)
};

// Throws if a token is outside [0, vocab_size).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size,
                       const ShardTokenizer& made_by = {});

// A read-only, memory-mapped shard.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);  // validates everything, including the CRC32
  ~TokenShard();
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&&) = delete;
  TokenShard(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return n_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  int version() const { return version_; }
  const ShardTokenizer& tokenizer() const { return tokenizer_; }
  int32_t operator[](int64_t i) const;
  void read(int64_t start, int64_t count, int32_t* out) const;  // tokens [start, start+count)
  std::vector<int32_t> read_all() const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
  int64_t n_tokens_ = 0, vocab_size_ = 0;
  int token_bytes_ = 2;
  int version_ = 0;
  ShardTokenizer tokenizer_;
};

}  // namespace dscpp
