// A checkpoint directory as a whole: which tag a resumed run takes, and what interrupted saves and prunes leave.
#include <algorithm>
#include <filesystem>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/universal.h"

namespace fs = std::filesystem;

namespace dscpp {

std::string find_resume_tag(const std::string& save_dir, std::string* note) {
  note->clear();
  try {
    return read_latest_tag(save_dir);  // a tag it names that does not load is the load's error, never skipped
  } catch (const CheckpointError& e) {
    if (e.kind != CheckpointErrorKind::missing_latest) throw;
  }
  std::vector<std::string> tags = list_tags(save_dir), rejected;
  for (auto t = tags.rbegin(); t != tags.rend(); ++t) {
    try {
      CheckpointReader r(save_dir, *t);  // manifest, sizes and CRC32s
      *note = save_dir + "/latest is missing; resuming from the newest complete tag, " + *t;
      if (!rejected.empty()) *note += " (newer, but not loadable: " + rejected.front() + ")";
      return *t;
    } catch (const CheckpointError& e) {
      rejected.push_back(*t + ": " + e.what());
    }
  }
  *note = save_dir + "/latest is missing and no tag there loads (";
  std::string found;
  for (const auto& r : rejected) found += (found.empty() ? "" : "; ") + r;
  for (const auto& l : checkpoint_leftovers(save_dir)) found += (found.empty() ? "" : "; ") + l.name + ": " + l.what;
  *note += (found.empty() ? (fs::exists(save_dir) ? "it holds no checkpoint" : "it does not exist") : found) + ")";
  return "";
}

void remove_all_checkpoints(const std::string& save_dir) {
  // The pointers first: a kill midway leaves tags no `latest` names, never a `latest` naming a deleted tag.
  for (const std::string f : {"latest", kLatestUniversalFile}) {
    std::error_code ec;
    fs::remove(save_dir + "/" + f, ec);
    if (ec) checkpoint_fail(CheckpointErrorKind::io, save_dir, "/", f, ": cannot remove: ", ec.message());
  }
  for (const auto& t : list_tags(save_dir)) remove_tag(save_dir, t);
  remove_checkpoint_leftovers(save_dir);
}

std::vector<CheckpointLeftover> checkpoint_leftovers(const std::string& save_dir) {
  std::vector<CheckpointLeftover> out;
  std::error_code ec;
  for (fs::directory_iterator it(save_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory() || it->is_symlink()) continue;
    const std::string name = it->path().filename().string();
    if (name.ends_with(".tmp"))
      out.push_back({name, true, "an interrupted save or deletion (the next save removes it)"});
    else if (name.ends_with(".old"))
      out.push_back({name, false, "a tag moved aside while a save replaced it, interrupted (it may be the only copy)"});
    else if (!fs::exists(it->path() / "manifest.json"))
      out.push_back({name, false, "not a checkpoint: no manifest.json (an older version's interrupted deletion, or "
                                  "not ours); remove it by hand if it is not needed"});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

void remove_checkpoint_leftovers(const std::string& save_dir) {
  for (const auto& l : checkpoint_leftovers(save_dir)) {
    std::error_code ec;  // best effort: what cannot go now is tried again at the next save
    if (l.removable) fs::remove_all(save_dir + "/" + l.name, ec);
  }
}

}  // namespace dscpp
