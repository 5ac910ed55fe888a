// World info: the active resources as JSON {"host": [slots], ...} in rank order, urlsafe base64 (RFC 4648 §5, with
// padding), as DeepSpeed passes it in --world_info. An ordered JSON object keeps the host order that ranks follow.
#include <cstring>

#include <nlohmann/json.hpp>

#include "dscpp/core/check.h"
#include "dscpp/launcher/resources.h"

namespace dscpp::launcher {

namespace {

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string b64_encode(const std::string& in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t)in[i] << 16 | (uint8_t)in[i + 1] << 8 | (uint8_t)in[i + 2];
    for (int k = 3; k >= 0; k--) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  size_t rest = in.size() - i;
  if (rest) {
    uint32_t v = (uint8_t)in[i] << 16 | (rest == 2 ? (uint8_t)in[i + 1] << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string b64_decode(const std::string& in) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* p = c ? std::strchr(kAlphabet, c) : nullptr;
    if (!p) DSCPP_FAIL("--world_info: '", c, "' is not a urlsafe base64 character");
    v = v << 6 | (uint32_t)(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += (char)((v >> bits) & 0xff);
    }
  }
  return out;
}

}  // namespace

std::string encode_world_info(const Resources& r) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (auto& h : r) j[h.name] = h.slots;
  return b64_encode(j.dump());
}

Resources decode_world_info(const std::string& b64) {
  std::string text = b64_decode(b64);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    DSCPP_FAIL("--world_info does not decode to JSON: ", e.what());
  }
  DSCPP_CHECK(j.is_object() && !j.empty(), "--world_info must be a non-empty object {host: [slots]}, got ", text);
  Resources r;
  for (auto& [host, slots] : j.items()) {
    DSCPP_CHECK(slots.is_array() && !slots.empty(), "--world_info: host '", host, "' needs a non-empty slot list");
    Host h{host, {}};
    for (auto& s : slots) {
      DSCPP_CHECK(s.is_number_integer() && s.get<int>() >= 0, "--world_info: bad slot ", s.dump(), " on ", host);
      h.slots.push_back(s.get<int>());
    }
    r.push_back(std::move(h));
  }
  return r;
}

}  // namespace dscpp::launcher
