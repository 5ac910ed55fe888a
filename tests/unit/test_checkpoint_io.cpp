// Checkpoint storage: safetensors byte layout (against a file written by hand per the spec), bit-exact round trips
// for every dtype, every validation error, manifest verification, `latest`/prune, and crash consistency (a fork()ed
// child dies at each fault point; the parent proves the previous tag still loads and `latest` is unchanged).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/atomic_file.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/crc32.h"
#include "dscpp/core/rng.h"
#include "checkpoint_fixtures.h"

using namespace dscpp;
using dscpp::test_fixtures::random_tensor;
using dscpp::test_fixtures::slurp;
using dscpp::test_fixtures::spit;
using dscpp::test_fixtures::expect_ckpt_error;
namespace fs = std::filesystem;
using K = CheckpointErrorKind;

namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("dscpp_ckpt_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    set_checkpoint_fault_hook({});
    fs::remove_all(dir_);
  }
  std::string dir_;
};


Tensor poisoned_like(const Tensor& t) {
  Tensor x = Tensor::empty(t.shape(), t.dtype());
  if (x.nbytes()) std::memset(x.raw(), 0xA5, x.nbytes());
  return x;
}

void expect_same_bytes(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto* pa = static_cast<const uint8_t*>(a.raw());
  const auto* pb = static_cast<const uint8_t*>(b.raw());
  for (size_t i = 0; i < a.nbytes(); i++)
    ASSERT_EQ(pa[i], pb[i]) << what << ": first differing byte " << i << " of " << a.nbytes();
}



// A hand-built safetensors file: header JSON text (padded here) + raw data.
std::string st_file(std::string json, const std::string& data, bool pad = true) {
  if (pad) json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  uint64_t n = json.size();
  for (int i = 0; i < 8; i++) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + json + data;
}

NamedTensors model_tensors(uint64_t seed) {
  return {{"wte", random_tensor({16, 8}, DType::f32, seed)},
          {"h.0.attn.weight", random_tensor({8, 24}, DType::bf16, seed + 1)},
          {"h.0.ln.bias", random_tensor({8}, DType::f16, seed + 2)}};
}

void save_tag(const std::string& dir, const std::string& tag, uint64_t seed, bool update_latest = true) {
  CheckpointWriter w(dir, tag);
  w.add_tensors("model.safetensors", model_tensors(seed), {{"step", tag}});
  w.add_json("client_state.json", {{"seed", seed}, {"tag", tag}});
  w.commit(update_latest);
}

void expect_tag_holds(const std::string& dir, const std::string& tag, uint64_t seed) {
  CheckpointReader r(dir, tag);
  auto got = r.read_tensors("model.safetensors");
  for (const auto& [name, want] : model_tensors(seed)) {
    ASSERT_TRUE(got.count(name)) << name;
    expect_same_bytes(got[name], want, tag + "/" + name);
  }
  EXPECT_EQ(r.read_json("client_state.json")["seed"].get<uint64_t>(), seed);
}

}  // namespace

// ---------------- safetensors ----------------

TEST(Crc32, MatchesZlibCheckValue) {
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32_update(crc32_update(0, "1234", 4), "56789", 5), 0xCBF43926u);  // streaming
  EXPECT_EQ(crc32_update(crc32_update(0, "1234", 4), nullptr, 0), crc32_update(0, "1234", 4));  // empty chunk
}

TEST_F(CheckpointTest, SafetensorsRoundTripEveryDtypeBitExact) {
  NamedTensors ts;
  uint64_t seed = 100;
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::fp8_e4m3, DType::fp8_e5m2})
    for (const Shape& s : {Shape{37}, Shape{3, 5, 7}, Shape{}, Shape{0, 4}})
      ts.emplace_back(std::string(dtype_name(t)) + "." + shape_str(s), random_tensor(s, t, seed++));
  std::string p = dir_ + "/all.safetensors";
  save_safetensors(p, ts, {{"format", "pt"}, {"note", "round trip"}});
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(getpid())));

  auto got = load_safetensors(p);
  ASSERT_EQ(got.size(), ts.size());
  for (const auto& [name, t] : ts) expect_same_bytes(got.at(name), t, name);

  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("note"), "round trip");
  NamedTensors dsts;
  for (const auto& [name, t] : ts) dsts.emplace_back(name, poisoned_like(t));
  f.read_all_into(dsts);
  for (size_t i = 0; i < ts.size(); i++) expect_same_bytes(dsts[i].second, ts[i].second, ts[i].first);
}

TEST_F(CheckpointTest, SafetensorsReadsIntoFlatBufferViews) {
  // The load path for a model: destinations are views of one flat buffer; bytes between them stay untouched.
  Tensor a = random_tensor({4, 6}, DType::f32, 1), b = random_tensor({10}, DType::f32, 2);
  std::string p = dir_ + "/m.safetensors";
  save_safetensors(p, {{"a", a}, {"b", b}});
  Tensor flat = Tensor::empty({48}, DType::f32);
  flat.fill(NAN);
  SafetensorsFile(p).read_all_into({{"b", flat.view_at(32, {10})}, {"a", flat.view_at(0, {4, 6})}});
  expect_same_bytes(flat.view_at(0, {4, 6}), a, "a");
  expect_same_bytes(flat.view_at(32, {10}), b, "b");
  for (int i = 24; i < 32; i++) EXPECT_TRUE(std::isnan(flat.data<float>()[i])) << "gap element " << i << " written";
}

TEST_F(CheckpointTest, SafetensorsHeaderPaddingAndLayout) {
  for (int len = 1; len <= 9; len++) {  // name lengths move the JSON size through every residue mod 8
    Tensor x = random_tensor({3}, DType::f16, uint64_t(len)), y = random_tensor({2, 2}, DType::i32, 50);
    std::string p = dir_ + "/pad" + std::to_string(len) + ".safetensors";
    save_safetensors(p, {{std::string(size_t(len), 'x'), x}, {"y", y}});
    std::string bytes = slurp(p);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
    ASSERT_EQ(n % 8, 0u) << "header length " << n;
    std::string json = bytes.substr(8, n);
    size_t close = json.find_last_of('}');
    EXPECT_EQ(json.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces: " << json;
    EXPECT_LT(json.size() - close - 1, 8u);
    auto h = nlohmann::json::parse(json);
    EXPECT_FALSE(h.contains("__metadata__"));  // omitted when empty, like the reference writer
    EXPECT_EQ(h["y"]["dtype"], "I32");
    EXPECT_EQ(h["y"]["shape"], nlohmann::json({2, 2}));
    EXPECT_EQ(h["y"]["data_offsets"], nlohmann::json({6, 22}));  // back to back, in the given order
    ASSERT_EQ(bytes.size(), 8 + n + 6 + 16);
    EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, x.raw(), 6), 0);
    EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 6, y.raw(), 16), 0);
  }
}

TEST_F(CheckpointTest, SafetensorsReadsFileWrittenByHand) {
  // Offsets deliberately out of key order: the spec orders data by offset, not by header key order.
  std::string json =
      R"({"__metadata__":{"format":"pt"},"ids":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},)"
      R"("w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"h":{"dtype":"BF16","shape":[],"data_offsets":[16,18]}})";
  std::string data;
  for (uint8_t b : {0x00, 0x00, 0xc0, 0x3f,    // 1.5f
                    0x00, 0x00, 0x00, 0xc0,    // -2.0f
                    0x07, 0x00, 0x00, 0x00,    // 7
                    0xff, 0xff, 0xff, 0xff,    // -1
                    0x80, 0x3f})               // bf16 1.0
    data.push_back(char(b));
  std::string p = dir_ + "/hand.safetensors";
  spit(p, st_file(json, data));
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "w");  // offset order
  Tensor w = f.read("w"), ids = f.read("ids"), h = f.read("h");
  EXPECT_EQ(w.shape(), (Shape{1, 2}));
  EXPECT_EQ(w.data<float>()[0], 1.5f);
  EXPECT_EQ(w.data<float>()[1], -2.0f);
  EXPECT_EQ(ids.data<int32_t>()[0], 7);
  EXPECT_EQ(ids.data<int32_t>()[1], -1);
  EXPECT_EQ(h.shape(), Shape{});
  EXPECT_EQ(load_as_float(h, 0), 1.0f);
}

TEST_F(CheckpointTest, SafetensorsRejectsMalformedFiles) {
  std::string p = dir_ + "/bad.safetensors";
  std::string d8(8, '\1');
  auto expect_bad = [&](const std::string& bytes, K kind, std::initializer_list<std::string> needles) {
    spit(p, bytes);
    expect_ckpt_error([&] { SafetensorsFile f(p); }, kind, needles);
  };
  std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  spit(p, st_file(ok, d8));
  EXPECT_NO_THROW(SafetensorsFile f(p));  // the baseline each case below breaks in one way

  expect_bad("abc", K::truncated, {p, "8-byte"});
  expect_bad(std::string("\xff\xff\xff\xff\0\0\0\0", 8) + "{}", K::bad_header, {p, "exceeds the limit"});
  expect_bad(st_file(ok, d8).substr(0, 20), K::truncated, {p, "header length"});
  expect_bad(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", d8), K::bad_header,
             {p, "invalid JSON"});
  expect_bad(st_file(R"([1,2])", ""), K::bad_header, {p, "not a JSON object"});
  expect_bad(st_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", d8), K::bad_header,
             {p, "tensor a", "unsupported dtype \"F64\""});
  expect_bad(st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8), K::bad_header,
             {p, "tensor a", "f32[3]", "span 8 bytes"});
  expect_bad(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8), K::bad_header,
             {p, "end before begin"});
  expect_bad(st_file(R"({"a":{"dtype":"F32","shape":[2]}})", d8), K::bad_header, {p, "tensor a", "needs"});
  expect_bad(st_file(R"({"a":{"dtype":"I8","shape":[-1],"data_offsets":[0,0]}})", ""), K::bad_header,
             {p, "non-negative"});
  expect_bad(st_file(R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"I8","shape":[4],"data_offsets":[2,6]}})", std::string(6, 'x')),
             K::bad_header, {p, "overlapping offsets", "tensor a [0, 4)", "tensor b [2, 6)"});
  expect_bad(st_file(R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"I8","shape":[2],"data_offsets":[6,8]}})", d8),
             K::bad_header, {p, "gap in data", "[4, 6)"});
  expect_bad(st_file(ok, d8.substr(0, 5)), K::truncated, {p, "need 8 data bytes, file has 5"});
  expect_bad(st_file(ok, d8 + "xx"), K::bad_header, {p, "2 trailing bytes"});
  expect_bad(st_file(R"({"__metadata__":{"k":1}})", ""), K::bad_header, {p, "__metadata__"});
  expect_ckpt_error([&] { SafetensorsFile f(dir_ + "/nope.safetensors"); }, K::missing_file, {"nope.safetensors"});
}

TEST_F(CheckpointTest, SafetensorsReadIntoChecksDtypeAndShapeBeforeReading) {
  std::string p = dir_ + "/m.safetensors";
  Tensor a = random_tensor({4, 9}, DType::f32, 3), b = random_tensor({5}, DType::bf16, 4);
  save_safetensors(p, {{"a", a}, {"b", b}});
  SafetensorsFile f(p);
  Tensor good_b = poisoned_like(b);
  expect_ckpt_error([&] { f.read_all_into({{"b", good_b}, {"a", Tensor::empty({4, 8}, DType::f32)}}); },
                    K::mismatch, {p + ": tensor a: expected f32[4, 8], checkpoint has f32[4, 9]"});
  EXPECT_EQ(static_cast<uint8_t*>(good_b.raw())[0], 0xA5) << "nothing may be read when any destination mismatches";
  expect_ckpt_error([&] { f.read_into("b", Tensor::empty({5}, DType::f16)); }, K::mismatch,
                    {"tensor b: expected f16[5], checkpoint has bf16[5]"});
  expect_ckpt_error([&] { f.read_into("c", Tensor::empty({5}, DType::f16)); }, K::unknown_tensor,
                    {p, "tensor c not found"});
  expect_ckpt_error([&] { f.read_all_into({{"a", poisoned_like(a)}}); }, K::unknown_tensor,
                    {p, "unknown tensor b"});
  EXPECT_NO_THROW(f.read_all_into({{"a", poisoned_like(a)}}, /*strict=*/false));
}

// ---------------- checkpoint directories ----------------

TEST_F(CheckpointTest, WriterReaderRoundTripAndLayout) {
  save_tag(dir_, "global_step10", 7);
  EXPECT_EQ(read_latest_tag(dir_), "global_step10");
  EXPECT_EQ(slurp(dir_ + "/latest"), "global_step10");  // DeepSpeed's format: the bare tag
  EXPECT_FALSE(fs::exists(dir_ + "/global_step10.tmp"));
  // The manifest is plain JSON with zlib CRCs, so tools outside the framework can verify it.
  auto m = nlohmann::json::parse(slurp(dir_ + "/global_step10/manifest.json"));
  EXPECT_EQ(m["format_version"], kCheckpointFormatVersion);
  std::string model = slurp(dir_ + "/global_step10/model.safetensors");
  EXPECT_EQ(m["files"]["model.safetensors"]["bytes"].get<uint64_t>(), model.size());
  EXPECT_EQ(m["files"]["model.safetensors"]["crc32"].get<uint32_t>(), crc32_update(0, model.data(), model.size()));

  expect_tag_holds(dir_, "", 7);  // "" reads latest
  CheckpointReader r(dir_);
  EXPECT_EQ(r.tag(), "global_step10");
  EXPECT_EQ(r.open_tensors("model.safetensors").metadata().at("step"), "global_step10");
  NamedTensors dst;
  for (const auto& [n, t] : model_tensors(7)) dst.emplace_back(n, poisoned_like(t));
  r.read_into("model.safetensors", dst);
  auto want = model_tensors(7);
  for (size_t i = 0; i < dst.size(); i++) expect_same_bytes(dst[i].second, want[i].second, dst[i].first);
  expect_ckpt_error([&] { r.read_json("other.json"); }, K::missing_file, {"other.json", "not in the manifest"});
}

TEST_F(CheckpointTest, SubdirectoryFileNamesAndBadNames) {
  CheckpointWriter w(dir_, "t");
  w.add_tensors("zero/wte/fp32.safetensors", {{"empty", Tensor::empty({0}, DType::f32)},  // zero bytes mid-CRC
                                              {"param", random_tensor({3}, DType::f32, 9)}});
  expect_ckpt_error([&] { w.add_json("../escape.json", {}); }, K::bad_argument, {"invalid file name"});
  expect_ckpt_error([&] { w.add_json("manifest.json", {}); }, K::bad_argument, {"invalid file name"});
  expect_ckpt_error([&] { w.add_tensors("zero/wte/fp32.safetensors", {}); }, K::bad_argument, {"added twice"});
  w.commit();
  expect_same_bytes(CheckpointReader(dir_).read_tensors("zero/wte/fp32.safetensors").at("param"),
                    random_tensor({3}, DType::f32, 9), "param");
  expect_ckpt_error([&] { CheckpointWriter bad(dir_, "a/b"); }, K::bad_argument, {"invalid checkpoint tag"});
  expect_ckpt_error([&] { CheckpointWriter bad(dir_, "x.tmp"); }, K::bad_argument, {"invalid checkpoint tag"});
}

TEST_F(CheckpointTest, ReaderRejectsCorruptedTruncatedAndMissingFiles) {
  save_tag(dir_, "t", 11);
  const std::string model = dir_ + "/t/model.safetensors", js = dir_ + "/t/client_state.json";
  const std::string good = slurp(model);

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;  // one bit in the tensor data: only the CRC can notice
  spit(model, flipped);
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::corrupted, {model, "CRC32"});
  EXPECT_NO_THROW(CheckpointReader(dir_, "", /*verify_crc=*/false));  // opt-out is explicit

  spit(model, good.substr(0, good.size() - 3));
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::truncated, {model, "manifest says"});
  expect_ckpt_error([&] { CheckpointReader r(dir_, "", false); }, K::truncated, {model});

  spit(model, good);
  fs::remove(js);
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::missing_file, {js});

  save_tag(dir_, "t", 11);
  spit(js, "{\"seed\": ");  // bad JSON with a consistent manifest: the file is named at parse time
  auto m = nlohmann::json::parse(slurp(dir_ + "/t/manifest.json"));
  m["files"]["client_state.json"] = {{"bytes", 9}, {"crc32", crc32_update(0, "{\"seed\": ", 9)}};
  spit(dir_ + "/t/manifest.json", m.dump());
  CheckpointReader r(dir_);
  expect_ckpt_error([&] { r.read_json("client_state.json"); }, K::bad_header, {js, "invalid JSON"});

  spit(dir_ + "/t/manifest.json", "{\"format\": ");
  expect_ckpt_error([&] { CheckpointReader r2(dir_); }, K::bad_header, {"manifest.json", "invalid JSON"});
  fs::remove(dir_ + "/t/manifest.json");
  expect_ckpt_error([&] { CheckpointReader r2(dir_); }, K::tag_not_found, {"manifest.json", "incomplete"});
}

TEST_F(CheckpointTest, ReadIntoReportsShapeMismatchAndUnknownTensor) {
  CheckpointWriter w(dir_, "t");
  w.add_tensors("model.safetensors", {{"w", random_tensor({4, 9}, DType::f32, 1)},
                                      {"b", random_tensor({4}, DType::f32, 2)}});
  w.commit();
  CheckpointReader r(dir_);
  const std::string f = dir_ + "/t/model.safetensors";
  expect_ckpt_error(
      [&] { r.read_into("model.safetensors", {{"w", Tensor::empty({4, 8}, DType::f32)}, {"b", Tensor::empty({4}, DType::f32)}}); },
      K::mismatch, {f + ": tensor w: expected f32[4, 8], checkpoint has f32[4, 9]"});
  expect_ckpt_error([&] { r.read_into("model.safetensors", {{"w", Tensor::empty({4, 9}, DType::f32)}}); },
                    K::unknown_tensor, {f, "unknown tensor b"});
  expect_ckpt_error([&] { r.read_into("model.safetensors", {{"q", Tensor::empty({4}, DType::f32)}}); },
                    K::unknown_tensor, {f, "tensor q not found"});
}

TEST_F(CheckpointTest, LatestHandlingAndPrune) {
  expect_ckpt_error([&] { read_latest_tag(dir_); }, K::missing_latest, {dir_ + "/latest"});
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::missing_latest, {"latest"});
  save_tag(dir_, "s1", 1);
  save_tag(dir_, "s2", 2);
  save_tag(dir_, "s3", 3, /*update_latest=*/false);
  EXPECT_EQ(read_latest_tag(dir_), "s2");
  expect_tag_holds(dir_, "s3", 3);
  save_tag(dir_, "s4", 4);
  EXPECT_EQ(list_tags(dir_), (std::vector<std::string>{"s1", "s2", "s3", "s4"}));
  expect_ckpt_error([&] { CheckpointReader r(dir_, "s9"); }, K::tag_not_found, {dir_ + "/s9", "tag not found"});

  spit(dir_ + "/latest", "s2\n");  // hand-edited with a newline: still read
  EXPECT_EQ(read_latest_tag(dir_), "s2");
  prune_old_tags(dir_, 1);  // keeps the newest, and the one `latest` names
  EXPECT_EQ(list_tags(dir_), (std::vector<std::string>{"s2", "s4"}));
  expect_tag_holds(dir_, "", 2);
  spit(dir_ + "/latest", "gone");
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::tag_not_found, {dir_ + "/gone", "named by"});
  spit(dir_ + "/latest", "../s2");
  expect_ckpt_error([&] { CheckpointReader r(dir_); }, K::bad_argument, {dir_ + "/latest", "invalid checkpoint tag"});
  spit(dir_ + "/latest", "  ");
  expect_ckpt_error([&] { read_latest_tag(dir_); }, K::missing_latest, {"empty"});
  expect_ckpt_error([&] { prune_old_tags(dir_, 0); }, K::bad_argument, {"keep_last"});
}

TEST_F(CheckpointTest, ResavingATagReplacesItWhole) {
  save_tag(dir_, "t", 1);
  {
    CheckpointWriter w(dir_, "t");  // second save of the same tag: fewer files, different data
    w.add_tensors("model.safetensors", model_tensors(2));
    w.commit();
  }
  CheckpointReader r(dir_);
  EXPECT_FALSE(r.has_file("client_state.json"));
  EXPECT_FALSE(fs::exists(dir_ + "/t/client_state.json"));
  expect_same_bytes(r.read_tensors("model.safetensors").at("wte"), model_tensors(2)[0].second, "wte");
  EXPECT_FALSE(fs::exists(dir_ + "/t.tmp"));
}

TEST_F(CheckpointTest, ExceptionMidSaveLeavesNoTrace) {
  save_tag(dir_, "s1", 1);
  set_checkpoint_fault_hook([](FaultPoint p) {
    if (p == FaultPoint::after_tensor_write) throw std::runtime_error("injected");
  });
  EXPECT_THROW(save_tag(dir_, "s2", 2), std::runtime_error);
  set_checkpoint_fault_hook({});
  EXPECT_FALSE(fs::exists(dir_ + "/s2.tmp"));
  EXPECT_FALSE(fs::exists(dir_ + "/s2"));
  EXPECT_EQ(read_latest_tag(dir_), "s1");
  expect_tag_holds(dir_, "", 1);
}

// A child process dies (no destructors, like kill -9) at each fault point while saving s2 over a directory whose
// latest is s1. The parent proves s1 loads bit-exact and `latest` still says s1, then that a new save of s2 works.
TEST_F(CheckpointTest, CrashAtEveryFaultPointLeavesPreviousTagLoadable) {
  for (FaultPoint fp : {FaultPoint::after_tensor_write, FaultPoint::before_manifest, FaultPoint::before_rename,
                        FaultPoint::before_latest}) {
    SCOPED_TRACE(fault_point_name(fp));
    fs::remove_all(dir_);
    save_tag(dir_, "s1", 1);
    const std::string latest_before = slurp(dir_ + "/latest");
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      set_checkpoint_fault_hook([fp](FaultPoint p) {
        if (p == fp) _exit(3);
      });
      try {
        save_tag(dir_, "s2", 2);
      } catch (...) {
        _exit(4);
      }
      _exit(0);  // the fault point was never reached: the parent fails the test
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 3) << "child did not die at the fault point";

    EXPECT_EQ(slurp(dir_ + "/latest"), latest_before);
    expect_tag_holds(dir_, "", 1);
    bool s2_visible = fs::exists(dir_ + "/s2");
    EXPECT_EQ(s2_visible, fp == FaultPoint::before_latest) << "s2 must appear only after the rename";
    if (s2_visible) expect_tag_holds(dir_, "s2", 2);  // complete, just not yet named by latest
    EXPECT_EQ(list_tags(dir_).front(), "s1");

    if (fs::exists(dir_ + "/s2.tmp")) spit(dir_ + "/s2.tmp/stale.bin", "x");  // a crashed run's leftover
    save_tag(dir_, "s2", 2);  // recovery: the stale s2.tmp is replaced, not reused
    EXPECT_FALSE(fs::exists(dir_ + "/s2/stale.bin"));
    EXPECT_EQ(read_latest_tag(dir_), "s2");
    expect_tag_holds(dir_, "", 2);
    EXPECT_FALSE(fs::exists(dir_ + "/s2.tmp"));
  }
}

TEST_F(CheckpointTest, CrashViaEnvironmentVariable) {
  save_tag(dir_, "s1", 1);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("DSCPP_CHECKPOINT_CRASH_AT", "before_rename", 1);
    try {
      save_tag(dir_, "s2", 2);
    } catch (...) {
      _exit(4);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 86);
  EXPECT_TRUE(fs::exists(dir_ + "/s2.tmp/manifest.json"));  // died with a complete temp dir, before the rename
  EXPECT_EQ(read_latest_tag(dir_), "s1");
  EXPECT_EQ(list_tags(dir_), std::vector<std::string>{"s1"});
  expect_tag_holds(dir_, "", 1);
}
