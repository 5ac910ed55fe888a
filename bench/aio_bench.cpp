// Swap I/O against the disk's raw sequential bandwidth, in one run on one folder (Note [Asynchronous swap I/O],
// swap/aio_handle.h):
//   aio_bench [--dir /nvme/tmp] [--gib 4] [--file-mib 256] [--in-flight 6] [--backends io_uring,libaio]
//             [--configs 1048576:8:1,1048576:32:4,8388608:32:4] [--repeat 3]
// raw: one thread, O_DIRECT, synchronous pwrite / pread of 64 MiB at a time over one file of --gib (the simple
//      loop: what the disk gives a plain sequential stream);
// swap: AioHandle, per backend and per aio config "block_size:queue_depth:intra_op_parallelism", over files of
//      --file-mib as the NVMe offload makes them (one file per tensor of a sub-group), --in-flight of them queued at
//      once (6: two Adam sub-groups of 3 tensors, pipeline_read or pipeline_write), until --gib are moved.
// Each pass writes the bytes (fdatasync included), then reads them back and checks what it read last; files are
// reserved first and removed after. Prints the best of --repeat for each row and its share of the raw loop's rate,
// as a table; bench/run_aio_bench.sh adds fio's rates when fio is installed.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "dscpp/swap/aio_handle.h"
#include "dscpp/swap/disk_check.h"

using namespace dscpp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void fill(Tensor& buf, uint32_t seed) {
  int32_t* w = buf.data<int32_t>();
  for (int64_t i = 0; i < buf.numel(); i++) w[i] = int32_t(uint32_t(i) * 2654435761u ^ seed);
}

void check(const Tensor& buf, uint32_t seed, const char* what) {
  const int32_t* w = buf.data<int32_t>();
  for (int64_t i = 0; i < buf.numel(); i++)
    if (w[i] != int32_t(uint32_t(i) * 2654435761u ^ seed)) {
      std::fprintf(stderr, "aio_bench: %s read back wrong bytes at %lld\n", what, (long long)(4 * i));
      std::exit(1);
    }
}

struct Rates {
  double write_gbps = 0, read_gbps = 0;
};

// The simple loop: synchronous 64 MiB O_DIRECT requests, one after the other, over one file.
Rates raw_pass(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/raw.tensor.swp";
  SwapFile f = SwapFile::create(path, bytes);
  ::unlink(path.c_str());
  Tensor buf = aio_buffer(64 * kMiB / 4, DType::i32, true);
  fill(buf, 11);
  Rates r;
  auto t0 = Clock::now();
  for (int64_t at = 0; at < bytes; at += 64 * kMiB) {
    const int64_t n = std::min(64 * kMiB, bytes - at);
    if (::pwrite(f.fd(), buf.raw(), size_t(n), at) != n) std::perror("aio_bench: pwrite"), std::exit(1);
  }
  ::fdatasync(f.fd());
  r.write_gbps = double(bytes) / seconds(t0) / 1e9;
  std::memset(buf.raw(), 0xff, size_t(64 * kMiB));
  t0 = Clock::now();
  for (int64_t at = 0; at < bytes; at += 64 * kMiB) {
    const int64_t n = std::min(64 * kMiB, bytes - at);
    if (::pread(f.fd(), buf.raw(), size_t(n), at) != n) std::perror("aio_bench: pread"), std::exit(1);
  }
  r.read_gbps = double(bytes) / seconds(t0) / 1e9;
  check(buf, 11, "raw");
  return r;
}

// The swapper's way: files of file_bytes, `in_flight` operations queued at once, each from its own buffer.
Rates swap_pass(const std::string& dir, int64_t bytes, int64_t file_bytes, int in_flight, AioHandle& aio) {
  const int64_t files_n = std::max<int64_t>(1, bytes / file_bytes);
  std::vector<SwapFile> files;
  for (int64_t i = 0; i < files_n; i++) {
    const std::string path = dir + "/" + std::to_string(i) + ".tensor.swp";
    files.push_back(SwapFile::create(path, file_bytes));
    ::unlink(path.c_str());
  }
  std::vector<Tensor> bufs;
  for (int i = 0; i < in_flight; i++) {
    bufs.push_back(aio_buffer(file_bytes / 4, DType::i32, true));
    fill(bufs.back(), uint32_t(i));
  }
  std::vector<uint32_t> seed(static_cast<size_t>(files_n));  // the buffer each file was written from
  std::vector<int64_t> last(size_t(in_flight), -1);  // per buffer: the last file read into it
  auto pass = [&](bool write) {
    std::deque<std::pair<AioHandle::Ticket, size_t>> queued;  // ticket, buffer
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < files_n; i++) {
      size_t b = size_t(i % in_flight);
      if (int64_t(queued.size()) == in_flight) {
        aio.wait(queued.front().first);
        b = queued.front().second;
        queued.pop_front();
      }
      const SwapFile& f = files[size_t(i)];
      if (write) seed[size_t(i)] = uint32_t(b);
      else last[b] = i;
      queued.push_back({write ? aio.write(f, bufs[b].raw(), file_bytes) : aio.read(f, bufs[b].raw(), file_bytes), b});
    }
    aio.wait_all();
    if (write)
      for (const SwapFile& f : files) ::fdatasync(f.fd());
    return double(files_n * file_bytes) / seconds(t0) / 1e9;
  };
  Rates r;
  r.write_gbps = pass(true);
  for (Tensor& b : bufs) std::memset(b.raw(), 0xff, size_t(file_bytes));
  r.read_gbps = pass(false);
  for (size_t b = 0; b < bufs.size(); b++)
    if (last[b] >= 0) check(bufs[b], seed[size_t(last[b])], "swap");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags{"aio_bench",
                           "aio_bench [--dir DIR] [--gib 4] [--file-mib 256] [--in-flight 6] "
                           "[--backends io_uring,libaio] [--configs 1048576:8:1,1048576:32:4,8388608:32:4] "
                           "[--repeat 3]\n"};
  std::string dir = "/tmp";
  if (const char* t = std::getenv("TMPDIR")) dir = t;
  int64_t gib = 4, file_mib = 256, in_flight = 6, repeat = 3;
  std::vector<std::string> backends = {"io_uring", "libaio"}, configs = {"1048576:8:1", "1048576:32:4", "8388608:32:4"};
  flags.parse(argc, argv, {}, [](const std::string&) {}, [&](const std::string& k, const std::string& v) {
    if (k == "dir") dir = v;
    else if (k == "gib") gib = flags.to_int(k, v, 1);
    else if (k == "file-mib") file_mib = flags.to_int(k, v, 1);
    else if (k == "in-flight") in_flight = flags.to_int(k, v, 1);
    else if (k == "backends") backends = bench::Flags::list(v);
    else if (k == "configs") configs = bench::Flags::list(v);
    else if (k == "repeat") repeat = flags.to_int(k, v, 1);
    else flags.fail("unknown flag --" + k);
  });
  const int64_t bytes = gib << 30, file_bytes = file_mib * kMiB;
  const int64_t free_bytes = disk_free_bytes(dir);
  if (free_bytes < bytes + 64 * kMiB)
    flags.fail("--dir " + dir + " has " + std::to_string(free_bytes >> 20) + " MiB free, the run needs " +
               std::to_string((bytes >> 20) + 64) + " (lower --gib)");
  std::printf("aio_bench: %s (%.1f GiB free), %lld GiB per pass, files of %lld MiB, %lld in flight, best of %lld\n",
              dir.c_str(), double(free_bytes) / double(int64_t(1) << 30), (long long)gib, (long long)file_mib,
              (long long)in_flight, (long long)repeat);
  auto best = [&](const std::function<Rates()>& run) {
    Rates b;
    for (int64_t i = 0; i < repeat; i++) {
      const Rates r = run();
      b.write_gbps = std::max(b.write_gbps, r.write_gbps);
      b.read_gbps = std::max(b.read_gbps, r.read_gbps);
    }
    return b;
  };
  const Rates raw = best([&] { return raw_pass(dir, bytes); });
  std::printf("%-46s %11s %11s %9s %9s\n", "method", "write GB/s", "read GB/s", "write %", "read %");
  auto row = [&](const std::string& name, const Rates& r) {
    std::printf("%-46s %11.2f %11.2f %8.0f%% %8.0f%%\n", name.c_str(), r.write_gbps, r.read_gbps,
                100 * r.write_gbps / raw.write_gbps, 100 * r.read_gbps / raw.read_gbps);
    std::fflush(stdout);
  };
  row("raw O_DIRECT loop (64 MiB pwrite/pread)", raw);
  for (const std::string& backend : backends)
    for (const std::string& cfg : configs) {
      const std::vector<std::string> parts = [&] {
        std::vector<std::string> p;
        size_t at = 0;
        for (size_t c; (c = cfg.find(':', at)) != std::string::npos; at = c + 1) p.push_back(cfg.substr(at, c - at));
        p.push_back(cfg.substr(at));
        return p;
      }();
      if (parts.size() != 3) flags.fail("--configs takes block_size:queue_depth:intra_op_parallelism, got " + cfg);
      AioConfig c;
      c.block_size = flags.to_int("configs", parts[0], 4096);
      c.queue_depth = flags.to_int("configs", parts[1], 1);
      c.intra_op_parallelism = flags.to_int("configs", parts[2], 1);
      const std::string name = "swap " + backend + " (block " + std::to_string(c.block_size >> 10) + " KiB, qd " +
                               std::to_string(c.queue_depth) + ", " + std::to_string(c.intra_op_parallelism) + " thr)";
      try {
        AioHandle aio(c, backend);
        row(name, best([&] { return swap_pass(dir, bytes, file_bytes, int(in_flight), aio); }));
      } catch (const Error& e) {
        std::printf("%-46s %s\n", name.c_str(), e.what());
      }
    }
  return 0;
}
