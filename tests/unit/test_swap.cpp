// The swap layer (Note [Asynchronous swap I/O], swap/aio_handle.h) on a temporary directory standing in for NVMe:
// both backends move bytes through O_DIRECT files exactly (a pattern written, the buffer poisoned, read back) under
// every aio setting; misaligned requests are refused, not rounded; a failing disk (a file size limit, the kernel's
// own EFBIG) fails the operation with the file, the offset and the system's error; the disk check and the probe.
// Where io_uring cannot start here (seccomp), its cases skip saying so and libaio's still run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "dscpp/swap/aio_handle.h"
#include "dscpp/swap/disk_check.h"
#include "swap_fixtures.h"
#include "test_helpers.h"

using namespace dscpp;
namespace fs = std::filesystem;
using dscpp::test::error_of;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("dscpp_swap_" + std::to_string(::getpid()) + "_" + std::to_string(count()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& count() {
    static int n = 0;
    return n;
  }
};

// Null where the backend is not built or cannot start here (or the temporary folder refuses O_DIRECT), with the
// reason in *why.
std::unique_ptr<AioHandle> handle_or_skip(const std::string& backend, const AioConfig& c = {},
                                          std::string* why = nullptr) {
  const std::string no = dscpp::test::swap_unavailable(TempDir().path.string());
  if (no.find("O_DIRECT") != std::string::npos) {
    if (why) *why = no;
    return nullptr;
  }
  try {
    return std::make_unique<AioHandle>(c, backend);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return nullptr;
  }
}

uint32_t pattern(int64_t i, uint32_t seed) { return uint32_t(i) * 2654435761u ^ seed; }

void fill(Tensor& t, uint32_t seed) {
  for (int64_t i = 0; i < t.numel(); i++) t.data<int32_t>()[i] = int32_t(pattern(i, seed));
}

// The first element of t[0, n) that is not pattern(i + first, seed), or -1.
int64_t first_wrong(const Tensor& t, int64_t n, uint32_t seed, int64_t first = 0) {
  for (int64_t i = 0; i < n; i++)
    if (uint32_t(t.data<int32_t>()[i]) != pattern(i + first, seed)) return i;
  return -1;
}

}  // namespace

class Backends : public ::testing::TestWithParam<std::string> {};

TEST_P(Backends, RoundTripUnderEveryAioSetting) {
  std::string why;
  if (!handle_or_skip(GetParam(), {}, &why)) GTEST_SKIP() << GetParam() << " cannot run here: " << why;
  TempDir dir;
  // Lengths that are not a multiple of the block size (a short last request) nor of the thread count's share.
  const int64_t bytes = 5 * 65536 + 3 * kAioAlignment;
  SwapFile f = SwapFile::create(dir.file("a.tensor.swp"), bytes + 2 * kAioAlignment);
  for (const AioConfig& c : {AioConfig{}, AioConfig{4096, 1, 1, false, true, false},
                             AioConfig{65536, 3, 3, true, true, false},
                             AioConfig{8192, 4, 2, false, false, false}, AioConfig{4096, 32, 7, true, false, false}}) {
    SCOPED_TRACE("block " + std::to_string(c.block_size) + " depth " + std::to_string(c.queue_depth) + " threads " +
                 std::to_string(c.intra_op_parallelism) + (c.single_submit ? " single" : "") +
                 (c.overlap_events ? " overlap" : ""));
    AioHandle aio(c, GetParam());
    EXPECT_EQ(aio_backend_name(aio.backend()), GetParam());
    Tensor buf = aio_buffer(bytes / 4, DType::i32, true);
    ASSERT_EQ(uintptr_t(buf.raw()) % kAioAlignment, 0u);
    const uint32_t seed = uint32_t(c.block_size + c.queue_depth);
    fill(buf, seed);
    aio.wait(aio.write(f, buf.raw(), bytes, kAioAlignment));  // at an offset
    std::memset(buf.raw(), 0xff, size_t(bytes));              // poison: NaN bits everywhere
    aio.wait(aio.read(f, buf.raw(), bytes, kAioAlignment));
    EXPECT_EQ(first_wrong(buf, bytes / 4, seed), -1);
    // A part from the middle, into another buffer.
    Tensor part = aio_buffer(2 * kAioAlignment / 4, DType::i32, false);
    std::memset(part.raw(), 0xff, size_t(2 * kAioAlignment));
    aio.wait(aio.read(f, part.raw(), 2 * kAioAlignment, kAioAlignment + 65536));
    EXPECT_EQ(first_wrong(part, 2 * kAioAlignment / 4, seed, 65536 / 4), -1);
  }
}

TEST_P(Backends, ManyOperationsInFlightWaitedOutOfOrder) {
  std::string why;
  auto aio = handle_or_skip(GetParam(), AioConfig{4096, 4, 2, false, true, false}, &why);
  if (!aio) GTEST_SKIP() << GetParam() << " cannot run here: " << why;
  TempDir dir;
  const int n = 12;
  const int64_t bytes = 6 * kAioAlignment;
  std::vector<SwapFile> files;
  std::vector<Tensor> bufs;
  std::vector<AioHandle::Ticket> t;
  for (int i = 0; i < n; i++) {
    files.push_back(SwapFile::create(dir.file(std::to_string(i) + ".tensor.swp"), bytes));
    bufs.push_back(aio_buffer(bytes / 4, DType::i32, true));
    fill(bufs.back(), uint32_t(i));
    t.push_back(aio->write(files.back(), bufs.back().raw(), bytes));
  }
  for (int i = n - 1; i >= 0; i--) aio->wait(t[size_t(i)]);
  for (int i = 0; i < n; i++) {
    std::memset(bufs[size_t(i)].raw(), 0xff, size_t(bytes));
    t[size_t(i)] = aio->read(files[size_t(i)], bufs[size_t(i)].raw(), bytes);
  }
  aio->wait_all();
  for (int i = 0; i < n; i++) EXPECT_EQ(first_wrong(bufs[size_t(i)], bytes / 4, uint32_t(i)), -1) << "file " << i;
  EXPECT_THROW(aio->wait(t[0]), Error) << "a ticket is waited for once";
}

TEST_P(Backends, MisalignedRequestsAreRefusedNotRounded) {
  std::string why;
  auto aio = handle_or_skip(GetParam(), {}, &why);
  if (!aio) GTEST_SKIP() << GetParam() << " cannot run here: " << why;
  TempDir dir;
  SwapFile f = SwapFile::create(dir.file("a.tensor.swp"), 4 * kAioAlignment);
  Tensor buf = aio_buffer(4 * kAioAlignment, DType::i8, false);
  char* p = static_cast<char*>(buf.raw());
  for (const auto& [what, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"length", [&] { aio->read(f, p, 1000); }},
           {"offset", [&] { aio->write(f, p, kAioAlignment, 512); }},
           {"buffer address", [&] { aio->read(f, p + 8, kAioAlignment); }}}) {
    const std::string e = error_of(call);
    EXPECT_NE(e.find("multiples of 4096"), std::string::npos) << what << ": " << e;
    EXPECT_NE(e.find(f.path()), std::string::npos) << e;
  }
  const std::string past = error_of([&] { aio->read(f, p, 2 * kAioAlignment, 3 * kAioAlignment); });
  EXPECT_NE(past.find("past the end"), std::string::npos) << past;
  // Reserved blocks read as zeros: a fresh swap file holds zero states.
  std::memset(p, 0x5a, size_t(4 * kAioAlignment));
  aio->wait(aio->read(f, p, 4 * kAioAlignment));
  for (int64_t i = 0; i < 4 * kAioAlignment; i++) ASSERT_EQ(p[i], 0) << "byte " << i;
}

// A write past RLIMIT_FSIZE fails in the kernel (EFBIG), as a full disk fails with ENOSPC: the operation's wait
// throws naming the file, the offset and the error; the handle stays usable for the requests that can succeed.
TEST_P(Backends, DiskErrorsFailTheOperationWithWhereAndWhy) {
  std::string why;
  if (!handle_or_skip(GetParam(), {}, &why)) GTEST_SKIP() << GetParam() << " cannot run here: " << why;
  TempDir dir;
  const int status = dscpp::test::child_exit_code([&] {
    int code = 0;
    try {
      ::signal(SIGXFSZ, SIG_IGN);  // the limit's signal would kill us; its EFBIG is what we want
      AioHandle aio(AioConfig{8192, 4, 2, false, true, false}, GetParam());
      const int64_t bytes = 16 * kAioAlignment;
      SwapFile f = SwapFile::create(dir.file("a.tensor.swp"), bytes);
      Tensor buf = aio_buffer(bytes / 4, DType::i32, true);
      fill(buf, 7);
      rlimit lim{rlim_t(10 * kAioAlignment), rlim_t(10 * kAioAlignment)};
      ::setrlimit(RLIMIT_FSIZE, &lim);
      const std::string e = error_of([&] { aio.wait(aio.write(f, buf.raw(), bytes)); });
      if (e.find("File too large") == std::string::npos || e.find(f.path()) == std::string::npos ||
          e.find("at offset") == std::string::npos)
        code = 3, std::fprintf(stderr, "error was: %s\n", e.c_str());
      aio.wait(aio.write(f, buf.raw(), 8 * kAioAlignment));  // below the limit: fine
      const std::string create = error_of([&] { SwapFile::create(dir.file("b.tensor.swp"), 64 * kAioAlignment); });
      if (create.find("reserving") == std::string::npos || create.find("b.tensor.swp") == std::string::npos)
        code = 4, std::fprintf(stderr, "create error was: %s\n", create.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 5;
    }
    return code;
  });
  EXPECT_EQ(status, 0) << "3: the write's error, 4: the reservation's, 5: unexpected (stderr above)";
}

INSTANTIATE_TEST_SUITE_P(Aio, Backends, ::testing::Values("io_uring", "libaio"),
                         [](const auto& i) { return i.param; });

TEST(Aio, AutoPrefersIoUringAndNamesAFallback) {
  std::string why;
  const bool uring = handle_or_skip("io_uring", {}, &why) != nullptr;
  auto aio = handle_or_skip("auto", {}, &why);
  if (!aio) GTEST_SKIP() << "no backend runs here: " << why;
  if (uring) {
    EXPECT_EQ(aio->backend(), AioBackend::io_uring);
    EXPECT_EQ(aio->notice(), "");
  } else {
    EXPECT_EQ(aio->backend(), AioBackend::libaio);
    EXPECT_NE(aio->notice().find("io_uring is unavailable"), std::string::npos) << aio->notice();
  }
}

TEST(Aio, ConfigRulesNameTheKey) {
  auto err = [](const AioConfig& c, const std::string& backend = "auto") {
    return error_of([&] { AioHandle h(c, backend); });
  };
  EXPECT_NE(err(AioConfig{1000}).find("aio.block_size = 1000"), std::string::npos);
  EXPECT_NE(err(AioConfig{4096, 0}).find("aio.queue_depth = 0"), std::string::npos);
  EXPECT_NE(err(AioConfig{4096, 8, 0}).find("aio.intra_op_parallelism = 0"), std::string::npos);
  EXPECT_NE(err(AioConfig{4096, 8, 1, false, true, true}).find("aio.use_gds"), std::string::npos);
  EXPECT_NE(err(AioConfig{}, "spdk").find("dscpp.offload.aio_backend = \"spdk\""), std::string::npos);
}

TEST(Aio, DiskCheckAndProbe) {
  std::string why;
  auto aio = handle_or_skip("auto", {}, &why);
  if (!aio) GTEST_SKIP() << "no backend runs here: " << why;
  TempDir dir;
  EXPECT_GT(disk_free_bytes(dir.path.string()), 0);
  const DiskSpeed s = probe_disk(dir.path.string(), 3 * 1048576 + 5, *aio);
  EXPECT_EQ(s.bytes, 3 * 1048576 + kAioAlignment);
  EXPECT_GT(s.write_gbps, 0.0);
  EXPECT_GT(s.read_gbps, 0.0);
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the probe file is removed";
  const std::string e = error_of([&] { disk_free_bytes(dir.file("missing")); });
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  const std::string c = error_of([&] { SwapFile::create(dir.file("no/such/dir.swp"), 4096); });
  EXPECT_NE(c.find("no/such/dir.swp"), std::string::npos) << c;
}
