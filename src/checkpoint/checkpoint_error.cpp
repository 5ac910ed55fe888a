#include "dscpp/checkpoint/checkpoint_error.h"

namespace dscpp {

const char* checkpoint_error_kind_name(CheckpointErrorKind k) {
  switch (k) {
    case CheckpointErrorKind::io: return "io";
    case CheckpointErrorKind::missing_file: return "missing_file";
    case CheckpointErrorKind::truncated: return "truncated";
    case CheckpointErrorKind::corrupted: return "corrupted";
    case CheckpointErrorKind::bad_header: return "bad_header";
    case CheckpointErrorKind::unknown_tensor: return "unknown_tensor";
    case CheckpointErrorKind::mismatch: return "mismatch";
    case CheckpointErrorKind::missing_latest: return "missing_latest";
    case CheckpointErrorKind::tag_not_found: return "tag_not_found";
    case CheckpointErrorKind::bad_argument: return "bad_argument";
    case CheckpointErrorKind::peer_failed: return "peer_failed";
  }
  return "?";
}

}  // namespace dscpp
