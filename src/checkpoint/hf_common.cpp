// Pieces both directions of the Hugging Face interop share: which tensors HF stores transposed, the transpose,
// byte sizes as transformers spells them, and config.json.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/checkpoint/checkpoint_error.h"
#include "dscpp/checkpoint/hf_interop.h"

namespace fs = std::filesystem;

namespace dscpp {

bool hf_is_transposed(const std::string& arch, const std::string& name) {
  if (arch != "gpt2") return false;  // Llama's nn.Linear weights are [out, in] in HF files too
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(s)) return true;
  return false;
}

Tensor transpose_2d(const Tensor& t) {
  DSCPP_CHECK(t.dim() == 2, "transpose_2d: expected a 2-D tensor, got ", t.str());
  Tensor src = t.device().is_cpu() ? t : t.to(Device::cpu());
  const int64_t R = src.size(0), C = src.size(1);
  const size_t es = dtype_size(src.dtype());
  Tensor out = Tensor::empty({C, R}, src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(out.raw());
  // out[c, r] = src[r, c]; 32x32 tiles keep both sides in cache for the 50K x 768 tables of real models.
  constexpr int64_t B = 32;
  for (int64_t r0 = 0; r0 < R; r0 += B)
    for (int64_t c0 = 0; c0 < C; c0 += B)
      for (int64_t r = r0; r < std::min(R, r0 + B); r++)
        for (int64_t c = c0; c < std::min(C, c0 + B); c++)
          std::memcpy(d + size_t(c * R + r) * es, s + size_t(r * C + c) * es, es);
  return out;
}

uint64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) i++;
  std::string num = text.substr(0, i), unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument(num);
  } catch (const std::exception&) {
    DSCPP_FAIL("byte size '", text, "': expected a number with an optional unit (e.g. 5GB, 500MB, 2GiB)");
  }
  double mult = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},           {"B", 1},          {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},      {"KIB", 1024.0},   {"MIB", 1048576.0},   {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [u, m] : units)
    if (unit == u) mult = m;
  DSCPP_CHECK(mult > 0, "byte size '", text, "': unknown unit '", unit, "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  DSCPP_CHECK(v * mult >= 1, "byte size '", text, "' must be at least 1 byte");
  return uint64_t(v * mult);
}

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  std::ifstream f(path);
  if (!f) {
    if (!fs::exists(path, ec)) checkpoint_fail(CheckpointErrorKind::missing_file, path, ": missing file");
    checkpoint_fail(CheckpointErrorKind::io, path, ": cannot open");
  }
  std::ostringstream os;
  os << f.rdbuf();
  try {
    return nlohmann::json::parse(os.str());
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(CheckpointErrorKind::bad_header, path, ": invalid JSON: ", e.what());
  }
}

ModelConfig read_hf_config(const std::string& dir) {
  std::error_code ec;
  const std::string path = fs::is_directory(dir, ec) ? dir + "/config.json" : dir;
  nlohmann::json j = read_json_file(path);
  try {
    return ModelConfig::from_hf_json(j);
  } catch (const Error& e) {
    checkpoint_fail(CheckpointErrorKind::bad_header, path, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(CheckpointErrorKind::bad_header, path, ": ", e.what());
  }
}

}  // namespace dscpp
