#include "dscpp/serve/model_stops.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dscpp/core/check.h"

namespace dscpp::serve {

std::vector<int32_t> model_stop_ids(const Tokenizer& tok, const std::string& model_dir) {
  std::vector<int32_t> ids = tok.stop_ids();
  const std::string path = model_dir + "/generation_config.json";
  std::ifstream in(path);
  if (!model_dir.empty() && in) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      DSCPP_FAIL(path, ": not valid JSON: ", e.what());
    }
    const nlohmann::json eos = cfg.is_object() ? cfg.value("eos_token_id", nlohmann::json()) : nlohmann::json();
    auto add = [&](const nlohmann::json& v) {
      DSCPP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < tok.vocab_size(), path,
                  ": eos_token_id must be a token id in [0, ", tok.vocab_size(), ") or a list of them, got ", v.dump());
      ids.push_back(int32_t(v.get<int64_t>()));
    };
    if (eos.is_array())
      for (const auto& v : eos) add(v);
    else if (!eos.is_null())
      add(eos);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace dscpp::serve
