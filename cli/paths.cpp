#include "cli/paths.h"

#include <unistd.h>

#include <climits>
#include <filesystem>

#include "dscpp/core/check.h"

namespace fs = std::filesystem;

namespace dscpp::cli {

namespace {
fs::path identity(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) c = fs::absolute(p);
  c = c.lexically_normal();
  if (!c.has_filename() && c != c.root_path()) c = c.parent_path();  // "dir/" names dir
  return c;
}
}  // namespace

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  DSCPP_CHECK(n > 0, "cannot read /proc/self/exe");
  return std::string(buf, size_t(n));
}

bool is_within(const std::string& path, const std::string& dir) {
  const fs::path rel = identity(path).lexically_relative(identity(dir));
  return !rel.empty() && *rel.begin() != "..";
}

std::string tag_holding(const std::string& save_dir, const std::string& path) {
  if (!is_within(path, save_dir)) return "";
  const fs::path rel = identity(path).lexically_relative(identity(save_dir));
  if (rel == ".") return "";
  const fs::path top = fs::path(save_dir) / *rel.begin();
  const std::string name = rel.begin()->string();
  std::error_code ec;
  return fs::exists(top / "manifest.json", ec) || name.ends_with(".tmp") ? name : "";
}

void refuse_output_on_inputs(const std::string& out_flag, const std::string& out, bool out_is_dir,
                             const std::vector<InputPath>& inputs) {
  const fs::path o = identity(out);
  for (const auto& in : inputs) {
    if (in.path.empty()) continue;
    const fs::path i = identity(in.path);
    if (o == i)
      DSCPP_FAIL(out_flag, " ", out, " is the file given as ", in.flag, " (", in.path,
                 "): this command would overwrite what it reads; write somewhere else");
    if (out_is_dir && o == i.parent_path())
      DSCPP_FAIL(out_flag, " ", out, " is the folder ", in.flag, " ", in.path, " is read from: this command does not "
                 "write where it reads (its files could replace that one); choose another folder");
  }
}

}  // namespace dscpp::cli
