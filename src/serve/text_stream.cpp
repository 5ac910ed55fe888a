#include "dscpp/serve/text_stream.h"

#include <algorithm>

namespace dscpp::serve {

size_t utf8_incomplete_tail(std::string_view s) {
  // Walk back over at most 3 continuation bytes to a lead byte; the tail is incomplete when the lead byte announces
  // more bytes than follow it.
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); back++) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;  // only continuation bytes: invalid, nothing to wait for
}

TextStream::TextStream(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::push(std::string_view bytes) {
  if (stopped_) return {};
  held_.append(bytes);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  std::string out;
  if (first != std::string::npos) {
    out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
  } else {
    // Hold the longest tail that a stop string starts with: the next bytes may complete it.
    size_t hold = 0;
    for (const std::string& s : stops_)
      for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; k--)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    size_t emit = held_.size() - hold;
    emit -= utf8_incomplete_tail(std::string_view(held_).substr(0, emit));
    out = held_.substr(0, emit);
    held_.erase(0, emit);
  }
  text_ += out;
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  text_ += out;
  return out;
}

}  // namespace dscpp::serve
