// CheckpointError: every failure of the checkpoint layer. The message always names the file (or directory) and what
// is wrong with it; `kind` lets callers react (e.g. start fresh on missing_latest) without parsing text.
#pragma once
#include <string>

#include "dscpp/core/check.h"

namespace dscpp {

enum class CheckpointErrorKind {
  io,              // open/read/write/fsync/rename failed (message carries strerror)
  missing_file,    // a file the manifest or caller names does not exist
  truncated,       // size differs from the manifest, or the data ends early
  corrupted,       // CRC32 differs from the manifest
  bad_header,      // safetensors header or JSON file malformed
  unknown_tensor,  // a tensor asked for is absent, or (strict) the file has one nobody asked for
  mismatch,        // dtype or shape differs from the destination
  missing_latest,  // save_dir/latest absent or empty
  tag_not_found,   // the tag directory is absent or has no manifest
  bad_argument,    // invalid tag / file name / tensor given by the caller
  peer_failed,     // another rank of a multi-rank save failed, died or timed out (the message names the rank)
};
const char* checkpoint_error_kind_name(CheckpointErrorKind k);

struct CheckpointError : Error {
  CheckpointError(CheckpointErrorKind k, const std::string& msg) : Error(msg), kind(k) {}
  CheckpointErrorKind kind;
};

// throw CheckpointError(kind, concat(args...))
template <typename... Args>
[[noreturn]] void checkpoint_fail(CheckpointErrorKind k, const Args&... args) {
  throw CheckpointError(k, detail::concat(args...));
}

}  // namespace dscpp
