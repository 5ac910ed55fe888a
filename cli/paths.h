// Commands never write where they read. Outputs are compared with inputs by identity before any work: symlinks,
// "..", "." and trailing slashes resolved, for paths that do not exist yet too.
#pragma once
#include <string>
#include <vector>

namespace dscpp::cli {

// The absolute path of the running dscpp executable (/proc/self/exe): what `dscpp launch` and `dscpp autotune` start.
std::string self_exe();

// `path` is `dir` or lies below it.
bool is_within(const std::string& path, const std::string& dir);

// The tag folder of checkpoint directory `save_dir` that `path` is or lies in (a folder holding manifest.json, or
// an unfinished "<tag>.tmp"); "" when none.
std::string tag_holding(const std::string& save_dir, const std::string& path);

struct InputPath {
  std::string flag;  // how the user named it: "--tokenizer", "input", ...
  std::string path;
};
// Throws when the output `out` (given as out_flag) is one of `inputs` or, for an output folder (out_is_dir), the
// folder one of them is read from.
void refuse_output_on_inputs(const std::string& out_flag, const std::string& out, bool out_is_dir,
                             const std::vector<InputPath>& inputs);

}  // namespace dscpp::cli
