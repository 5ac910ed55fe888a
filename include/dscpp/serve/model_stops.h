// Where generation stops for a model: every stop id its tokenizer names (Tokenizer::stop_ids: end of text, Llama 3's
// end of turn) and its folder's generation_config.json eos_token_id (an int or a list), deduplicated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/data/tokenizer.h"

namespace dscpp::serve {

// model_dir "" (a checkpoint of ours): the tokenizer's only. Throws dscpp::Error for a generation_config.json whose
// eos_token_id is not an id or a list of ids in the vocabulary.
std::vector<int32_t> model_stop_ids(const Tokenizer& tok, const std::string& model_dir);

}  // namespace dscpp::serve
