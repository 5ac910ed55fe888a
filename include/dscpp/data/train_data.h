// The data behind `dscpp train`: a tokenizer and token shards. Shards given by the user are checked against the
// tokenizer given with them; text (the user's files or the built-in corpus) is tokenized into a cache under
// <out>/data that is reused only while it matches what would make it now (Note [Data cache key] in
// src/data/train_data.cpp), and rebuilt with a message saying why otherwise.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "dscpp/data/tokenizer.h"

namespace dscpp {

struct TrainDataRequest {
  std::vector<std::string> data;  // --data: token shards (*.bin) or text files; empty = the built-in corpus
  std::string tokenizer;          // --tokenizer: tokenizer.json, or vocab.json with merges.txt beside it; "" = train
  int vocab_size = 2048;          // --vocab-size of a trained tokenizer
  std::string cache_dir;          // where text is tokenized to (<out>/data)
};

struct TrainData {
  Tokenizer tokenizer;
  std::string tokenizer_path;     // the file it was read from or saved to (checkpoints carry it)
  std::vector<std::string> shards;
};

// Throws, naming --data and --tokenizer, when shards were made by another tokenizer than the one given (or hold
// another vocabulary size). log: progress, and why a cache is rebuilt (nullptr: quiet).
TrainData prepare_train_data(const TrainDataRequest& req, std::ostream* log);

// tokenizer.json, or GPT-2's vocab.json with merges.txt beside it.
Tokenizer load_tokenizer_file(const std::string& path);

}  // namespace dscpp
