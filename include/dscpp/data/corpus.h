// The built-in training corpus: the English fortunes of Debian's `fortunes` package (~2.5 MB), so `dscpp train`
// works offline with nothing but Debian packages.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

class Tokenizer;

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// One document per fortune: the files directly in `dir` (not *.dat, *.u8 or subfolders), in name order, split on
// lines holding only "%". Throws, naming the `fortunes` package, when the files are missing.
std::vector<std::string> default_corpus_documents(const std::string& dir = kFortunesDir);

// All documents joined by "<|endoftext|>", so Tokenizer::encode puts the EOT token between documents.
std::string default_corpus_text(const std::string& dir = kFortunesDir);

// Token stream of `docs`, each document preceded by the EOT token (as GPT-2 training data is laid out).
std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& docs);

// Splits `text` into documents on lines equal to `separator` (without the newline); empty documents are dropped.
// An empty separator means the whole text is one document.
std::vector<std::string> split_documents(const std::string& text, const std::string& separator);

}  // namespace dscpp
