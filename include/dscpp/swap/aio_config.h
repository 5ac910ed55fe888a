// The config's "aio" section (DeepSpeed runtime/swap_tensor/aio_config.py) and the asynchronous I/O backends this
// build has. The swap layer reads it; the runtime's config parser fills it (Note [Asynchronous swap I/O],
// swap/aio_handle.h, says what each key does here).
#pragma once
#include <cstdint>
#include <string>

namespace dscpp {

struct AioConfig {                       // "aio": how swap files are read and written
  int64_t block_size = 1048576;          // bytes per request (a multiple of 4096: requests are O_DIRECT)
  int64_t queue_depth = 8;               // requests in flight per I/O thread
  int64_t intra_op_parallelism = 1;      // I/O threads that split each read or write (legacy name thread_count)
  bool single_submit = false;            // one system call per request instead of one per batch
  bool overlap_events = true;            // refill the queue as each request completes (else batch by batch)
  bool use_gds = false;                  // GPUDirect Storage: refused when true
};

enum class AioBackend { io_uring, libaio };

const char* aio_backend_name(AioBackend b);   // "io_uring", "libaio"
bool aio_backend_built(AioBackend b);         // this build links the backend's library (liburing, libaio)
// What a build without any backend lacks, for errors: "" when at least one is built.
std::string aio_missing_libraries();

}  // namespace dscpp
