// Built-in corpus (Debian `fortunes`) and document splitting.
#include "dscpp/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/core/check.h"
#include "dscpp/data/tokenizer.h"

namespace dscpp {

namespace fs = std::filesystem;

std::vector<std::string> split_documents(const std::string& text, const std::string& separator) {
  std::vector<std::string> docs;
  if (separator.empty()) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  std::string cur;
  size_t i = 0;
  while (i < text.size()) {
    size_t nl = text.find('\n', i);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view line(text.data() + i, (nl == std::string::npos ? text.size() : nl) - i);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == separator) {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.append(text, i, end - i);
    }
    i = end;
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

std::vector<std::string> default_corpus_documents(const std::string& dir) {
  std::error_code ec;
  DSCPP_CHECK(fs::is_directory(dir, ec), "built-in corpus: ", dir,
              " not found; install Debian's `fortunes` package (apt-get install fortunes) or pass your own text");
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    std::string ext = e.path().extension().string();
    if (ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  DSCPP_CHECK(!files.empty(), "built-in corpus: no fortune files in ", dir,
              "; install Debian's `fortunes` package (apt-get install fortunes)");
  std::vector<std::string> docs;
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    DSCPP_CHECK(in.good(), "built-in corpus: cannot read ", f.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    for (auto& d : split_documents(ss.str(), "%")) docs.push_back(std::move(d));
  }
  return docs;
}

std::string default_corpus_text(const std::string& dir) {
  std::string out;
  for (auto& d : default_corpus_documents(dir)) {
    if (!out.empty()) out += kEotToken;
    out += d;
  }
  return out;
}

std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<int32_t> out;
  const int32_t bos = tok.bos_id();  // GPT-2: EOT before each document; Llama 3: <|begin_of_text|>
  for (auto& d : docs) {
    out.push_back(bos);
    std::vector<int32_t> ids = tok.encode_ordinary(d);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

}  // namespace dscpp
