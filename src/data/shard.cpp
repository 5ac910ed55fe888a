// Token shard files (format in shard.h).
#include "dscpp/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cerrno>
#include <cstring>

#include "dscpp/core/check.h"

namespace dscpp {

static_assert(std::endian::native == std::endian::little, "shard files are little-endian; add byte swapping");

namespace {
constexpr char kMagic[8] = {'D', 'S', 'C', 'P', 'P', 'T', 'O', 'K'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t vocab_size;
  uint64_t n_tokens;
  uint32_t crc32;
  uint32_t header_crc;  // CRC32 of the 36 bytes above
  // Version 2: the tokenizer record (version 1 has zeros here).
  uint64_t tokenizer_fingerprint;
  char tokenizer_name[204];
  uint32_t record_crc;  // CRC32 of the fingerprint and the name
};
static_assert(sizeof(Header) == kShardHeaderBytes);
constexpr size_t kRecordBegin = offsetof(Header, tokenizer_fingerprint);

uint32_t crc_of(const unsigned char* p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {  // zlib takes uInt lengths
    uInt chunk = uInt(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return uint32_t(crc);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      DSCPP_FAIL("writing ", path, ": ", std::strerror(e));
    }
    p += w;
    n -= size_t(w);
  }
}
}  // namespace

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size,
                       const ShardTokenizer& made_by) {
  DSCPP_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 31), "shard ", path, ": bad vocab size ", vocab_size);
  const int tb = vocab_size <= 65536 ? 2 : 4;
  std::vector<unsigned char> payload(tokens.size() * tb);
  for (size_t i = 0; i < tokens.size(); i++) {
    int32_t t = tokens[i];
    DSCPP_CHECK(t >= 0 && t < vocab_size, "shard ", path, ": token ", i, " is ", t, ", outside the vocab of ",
                vocab_size);
    if (tb == 2) { uint16_t v = uint16_t(t); std::memcpy(&payload[i * 2], &v, 2); }
    else std::memcpy(&payload[i * 4], &t, 4);
  }
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kShardVersion;
  h.token_bytes = uint32_t(tb);
  h.vocab_size = uint64_t(vocab_size);
  h.n_tokens = tokens.size();
  h.crc32 = crc_of(payload.data(), payload.size());
  h.header_crc = crc_of(reinterpret_cast<const unsigned char*>(&h), offsetof(Header, header_crc));
  h.tokenizer_fingerprint = made_by.fingerprint;
  std::memcpy(h.tokenizer_name, made_by.name.data(), std::min(made_by.name.size(), sizeof h.tokenizer_name - 1));
  h.record_crc = crc_of(reinterpret_cast<const unsigned char*>(&h) + kRecordBegin,
                        offsetof(Header, record_crc) - kRecordBegin);

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DSCPP_CHECK(fd >= 0, "cannot create ", tmp, ": ", std::strerror(errno));
  write_all(fd, &h, sizeof h, tmp);
  write_all(fd, payload.data(), payload.size(), tmp);
  bool ok = ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    DSCPP_FAIL("cannot write shard ", path, ": ", std::strerror(e));
  }
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DSCPP_CHECK(fd >= 0, "token shard ", path, ": cannot open: ", std::strerror(errno));
  struct stat st{};
  ::fstat(fd, &st);
  size_t bytes = size_t(st.st_size);
  if (bytes < kShardHeaderBytes) {
    ::close(fd);
    DSCPP_FAIL("token shard ", path, ": file is ", bytes, " bytes, shorter than the ", kShardHeaderBytes,
               "-byte header (truncated or not a shard)");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  DSCPP_CHECK(m != MAP_FAILED, "token shard ", path, ": mmap failed: ", std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  map_bytes_ = bytes;
  try {
    Header h;
    std::memcpy(&h, map_, sizeof h);
    DSCPP_CHECK(std::memcmp(h.magic, kMagic, 8) == 0, "token shard ", path, ": bad magic (not a dscpp token shard)");
    DSCPP_CHECK(h.header_crc == crc_of(map_, offsetof(Header, header_crc)), "token shard ", path,
                ": header checksum mismatch (corrupted header)");
    DSCPP_CHECK(h.version >= 1 && h.version <= kShardVersion, "token shard ", path, ": version ", h.version,
                ", this build reads 1 to ", kShardVersion);
    if (h.version >= 2) {
      DSCPP_CHECK(h.record_crc == crc_of(map_ + kRecordBegin, offsetof(Header, record_crc) - kRecordBegin),
                  "token shard ", path, ": tokenizer record checksum mismatch (corrupted header)");
      tokenizer_.fingerprint = h.tokenizer_fingerprint;
      tokenizer_.name.assign(h.tokenizer_name, strnlen(h.tokenizer_name, sizeof h.tokenizer_name));
    }
    DSCPP_CHECK(h.token_bytes == 2 || h.token_bytes == 4, "token shard ", path, ": token size ", h.token_bytes,
                " bytes, expected 2 or 4");
    size_t expect = kShardHeaderBytes + h.n_tokens * h.token_bytes;
    DSCPP_CHECK(bytes == expect, "token shard ", path, ": file is ", bytes, " bytes, header says ", h.n_tokens,
                " tokens of ", h.token_bytes, " bytes = ", expect, " bytes (", bytes < expect ? "truncated" : "trailing data",
                ")");
    uint32_t crc = crc_of(map_ + kShardHeaderBytes, bytes - kShardHeaderBytes);
    DSCPP_CHECK(crc == h.crc32, "token shard ", path, ": payload CRC32 is ", std::hex, crc, ", header says ", h.crc32,
                " (corrupted)");
    n_tokens_ = int64_t(h.n_tokens);
    vocab_size_ = int64_t(h.vocab_size);
    token_bytes_ = int(h.token_bytes);
    version_ = int(h.version);
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    throw;
  }
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_bytes_(o.map_bytes_), n_tokens_(o.n_tokens_),
      vocab_size_(o.vocab_size_), token_bytes_(o.token_bytes_), version_(o.version_),
      tokenizer_(std::move(o.tokenizer_)) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

int32_t TokenShard::operator[](int64_t i) const {
  int32_t v;
  read(i, 1, &v);
  return v;
}

void TokenShard::read(int64_t start, int64_t count, int32_t* out) const {
  DSCPP_CHECK(start >= 0 && count >= 0 && start + count <= n_tokens_, "token shard ", path_, ": read [", start, ", ",
              start + count, ") past its ", n_tokens_, " tokens");
  const unsigned char* p = map_ + kShardHeaderBytes + size_t(start) * token_bytes_;
  if (token_bytes_ == 4) { std::memcpy(out, p, size_t(count) * 4); return; }
  for (int64_t i = 0; i < count; i++) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    out[i] = int32_t(v);
  }
}

std::vector<int32_t> TokenShard::read_all() const {
  std::vector<int32_t> v(static_cast<size_t>(n_tokens_));
  read(0, n_tokens_, v.data());
  return v;
}

}  // namespace dscpp
