// safetensors reader/writer: round trips for every dtype, exact half/bfloat16
// widening, memory-mapped files, and one hostile input per validation rule
// (each checking the message, not only that something threw).
#include "ldlm/io/safetensors.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "support/errors.hpp"
#include "support/memory.hpp"

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace unit_io_safetensors {
namespace {

using ldlm::test::error_of;
using ldlm::test::resident_bytes_of_mapping;

using ldlm::DType;
using ldlm::SafetensorsFile;
using ldlm::SafetensorsWriter;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes = 0) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = std::byte((std::uint64_t(header.size()) >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

template <class T>
std::span<const std::byte> as_bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

std::string format_error(std::vector<std::byte> buf) {
  return error_of<ldlm::FormatError>([&] { SafetensorsFile::from_buffer(std::move(buf)); });
}
std::string format_error(const std::string& header, std::size_t data_bytes) {
  return format_error(raw_file(header, data_bytes));
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() / ("ldlm_st_" + std::to_string(::getpid()) + "_" + std::to_string(n_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }

 private:
  static inline int n_ = 0;
  fs::path path_;
};

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

TEST(Safetensors, RoundTripTypedDtypes) {
  const std::vector<float> f32{1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-40f};
  const std::vector<double> f64{1.0 / 3.0, -1e300, 5e-324};
  const std::vector<std::int64_t> i64{std::numeric_limits<std::int64_t>::min(), -1, 0, 1LL << 40};
  const std::vector<std::int32_t> i32{std::numeric_limits<std::int32_t>::min(), 7,
                                      std::numeric_limits<std::int32_t>::max(), 0};
  SafetensorsWriter w;
  w.add("f32", {2, 3}, f32.data());
  w.add("f64", {3}, f64.data());
  w.add("i64", {2, 2}, i64.data());
  w.add("i32", {4}, i32.data());
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());

  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "f32");  // sorted by name
  EXPECT_EQ(f.tensors()[3].name, "i64");
  EXPECT_EQ(f.info("f32").dtype, DType::F32);
  EXPECT_EQ(f.info("f32").shape, (ldlm::Shape{2, 3}));
  EXPECT_EQ(f.info("f64").dtype, DType::F64);
  EXPECT_EQ(f.info("i64").dtype, DType::I64);
  EXPECT_EQ(f.info("i32").dtype, DType::I32);

  EXPECT_EQ(f.read<float>("f32"), f32);
  EXPECT_EQ(f.read<double>("f64"), f64);
  EXPECT_EQ(f.read<std::int64_t>("i64"), i64);
  EXPECT_EQ(f.read<std::int32_t>("i32"), i32);
  EXPECT_EQ(f.read<double>("f32")[2], 3.25);
  EXPECT_EQ(f.read<float>("f64")[0], float(1.0 / 3.0));
  // Integer dtypes may be read as floats and as the other integer width.
  EXPECT_EQ(f.read<float>("i32")[1], 7.0f);
  EXPECT_EQ(f.read<double>("i64")[3], double(1LL << 40));
  EXPECT_EQ(f.read<std::int64_t>("i32"), (std::vector<std::int64_t>(i32.begin(), i32.end())));
  const auto bytes = f.bytes("f32");
  ASSERT_EQ(bytes.size(), f32.size() * 4);
  EXPECT_EQ(std::memcmp(bytes.data(), f32.data(), bytes.size()), 0);
}

TEST(Safetensors, ReadIntoChecksCount) {
  const std::vector<float> v{1, 2, 3};
  SafetensorsWriter w;
  w.add("x", {3}, v.data());
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  double out[3];
  f.read_into("x", out, 3);
  EXPECT_EQ(out[2], 3.0);
  const auto msg = error_of<ldlm::CheckpointError>([&] { f.read_into("x", out, 2); });
  EXPECT_THAT(msg, HasSubstr("tensor 'x'"));
  EXPECT_THAT(msg, HasSubstr("has 3 elements, but the destination holds 2"));
}

TEST(Safetensors, Int64ReadAsInt32ChecksRange) {
  const std::vector<std::int64_t> v{1, std::int64_t(1) << 33};
  SafetensorsWriter w;
  w.add("big", {2}, v.data());
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  EXPECT_THAT(error_of<ldlm::FormatError>([&] { f.read<std::int32_t>("big"); }),
              HasSubstr("tensor 'big' value 8589934592 does not fit int32"));
}

TEST(Safetensors, HalfWideningExact) {
  // 1.0, -2.5, 65504 (max), 2^-24 (smallest subnormal), 1023 * 2^-24 (largest subnormal),
  // 2^-14 (smallest normal), -0, +inf, -inf, nan.
  const std::vector<std::uint16_t> h{0x3C00, 0xC100, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x8000, 0x7C00, 0xFC00, 0x7E00};
  SafetensorsWriter w;
  w.add("h", DType::F16, {2, 5}, as_bytes(h));
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  EXPECT_EQ(f.info("h").dtype, DType::F16);
  const auto v = f.read<float>("h");
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.5f);
  EXPECT_EQ(v[2], 65504.0f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[4], 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(v[5], std::ldexp(1.0f, -14));
  EXPECT_EQ(v[6], 0.0f);
  EXPECT_TRUE(std::signbit(v[6]));
  EXPECT_EQ(v[7], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[8], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[9]));
  EXPECT_EQ(f.read<double>("h")[1], -2.5);
  EXPECT_THAT(error_of<ldlm::FormatError>([&] { f.read<std::int32_t>("h"); }),
              HasSubstr("tensor 'h' has dtype F16, expected an integer dtype"));
}

TEST(Safetensors, BFloat16WideningExact) {
  // 1.0, -2.5, max finite, smallest subnormal 2^-133, +inf, -inf, nan.
  const std::vector<std::uint16_t> h{0x3F80, 0xC020, 0x7F7F, 0x0001, 0x7F80, 0xFF80, 0x7FC0};
  SafetensorsWriter w;
  w.add("b", DType::BF16, {7}, as_bytes(h));
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  const auto v = f.read<float>("b");
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.5f);
  EXPECT_EQ(v[2], 0x1.FEp127f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(v[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[5], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[6]));
}

TEST(Safetensors, NarrowIntegerAndBoolDtypesRead) {
  // Checkpoints hold these for buffers (GPT-2's causal mask is BOOL); every read target works.
  const std::vector<std::int16_t> i16{-32768, -1, 32767};
  const std::vector<std::int8_t> i8{-128, 0, 127};
  const std::vector<std::uint8_t> u8{0, 1, 255};
  const std::vector<std::uint8_t> b{0, 1, 2};  // a nonzero byte is true
  SafetensorsWriter w;
  w.add("i16", DType::I16, {3}, as_bytes(i16));
  w.add("i8", DType::I8, {3}, as_bytes(i8));
  w.add("u8", DType::U8, {3}, as_bytes(u8));
  w.add("mask", DType::BOOL, {1, 3}, as_bytes(b));
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  EXPECT_EQ(f.info("mask").dtype, DType::BOOL);
  EXPECT_EQ(f.info("mask").numel(), 3);
  EXPECT_EQ(f.read<std::int64_t>("i16"), (std::vector<std::int64_t>{-32768, -1, 32767}));
  EXPECT_EQ(f.read<std::int32_t>("i8"), (std::vector<std::int32_t>{-128, 0, 127}));
  EXPECT_EQ(f.read<float>("u8"), (std::vector<float>{0, 1, 255}));
  EXPECT_EQ(f.read<double>("mask"), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(f.read<std::int64_t>("mask"), (std::vector<std::int64_t>{0, 1, 1}));
  for (const char* name : {"I16", "I8", "U8", "BOOL"}) EXPECT_EQ(dtype_name(ldlm::parse_dtype(name)), name);
}

TEST(Safetensors, MetadataRoundTrip) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("config", R"({"d_model": 768})");
  w.set_metadata("format", "ldlm");  // last value wins in the writer
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"config", R"({"d_model": 768})"}, {"format", "ldlm"}}));
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Safetensors, EmptyAndScalarTensors) {
  const float one = 1.0f;
  SafetensorsWriter w;
  w.add<float>("a_empty", {0, 4}, nullptr);
  w.add("b_scalar", {}, &one);
  w.add<std::int64_t>("c_empty", {3, 0}, nullptr);
  const auto f = SafetensorsFile::from_buffer(w.to_bytes());
  EXPECT_TRUE(f.read<float>("a_empty").empty());
  EXPECT_EQ(f.info("a_empty").shape, (ldlm::Shape{0, 4}));
  EXPECT_EQ(f.read<float>("b_scalar"), std::vector<float>{1.0f});
  EXPECT_TRUE(f.info("b_scalar").shape.empty());
  EXPECT_TRUE(f.read<std::int64_t>("c_empty").empty());
}

TEST(Safetensors, WriterLayout) {
  const std::vector<float> a{1}, b{2, 3};
  SafetensorsWriter w;
  w.add("zz", {2}, b.data());
  w.add("aa", {1}, a.data());
  w.set_metadata("k", "v");
  const auto bytes = w.to_bytes();
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"k":"v"},"aa":{"data_offsets":[0,4],"dtype":"F32","shape":[1]},)"
            R"("zz":{"data_offsets":[4,12],"dtype":"F32","shape":[2]}})");
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  float data[3];
  std::memcpy(data, bytes.data() + 8 + n, sizeof data);
  EXPECT_EQ(data[0], 1.0f);  // name order
  EXPECT_EQ(data[2], 3.0f);
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::vector<float> v{1, 2, 3};
  SafetensorsWriter w;
  w.add("x", {3}, v.data());
  EXPECT_THAT(error_of<ldlm::InvalidArgument>([&] { w.add("x", {3}, v.data()); }),
              HasSubstr("duplicate tensor name 'x'"));
  EXPECT_THAT(error_of<ldlm::InvalidArgument>([&] { w.add("y", DType::F32, {4}, as_bytes(v)); }),
              HasSubstr("tensor 'y' shape [4] with dtype F32 needs 16 bytes, got 12"));
  EXPECT_THAT(error_of<ldlm::InvalidArgument>([&] { w.add("z", {-1}, v.data()); }),
              HasSubstr("tensor 'z' has a negative extent"));
  EXPECT_THAT(error_of<ldlm::InvalidArgument>([&] { w.add("__metadata__", {3}, v.data()); }),
              HasSubstr("reserved name"));
}

TEST(Safetensors, UnalignedDataIsReadByCopy) {
  // A 3-byte header padding puts the data section at an odd address offset.
  const std::string header = R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}} )";
  ASSERT_NE(header.size() % 8, 0u);
  auto buf = raw_file(header, 20);
  const double d[2] = {0.5, -7.0};
  const float x = 2.5f;
  std::memcpy(buf.data() + 8 + header.size(), d, 16);
  std::memcpy(buf.data() + 8 + header.size() + 16, &x, 4);
  const auto f = SafetensorsFile::from_buffer(std::move(buf));
  EXPECT_EQ(f.read<double>("d"), (std::vector<double>{0.5, -7.0}));
  EXPECT_EQ(f.read<float>("f"), std::vector<float>{2.5f});
}

// ---------------------------------------------------------------------------
// Files: mmap, atomic write, I/O errors
// ---------------------------------------------------------------------------

TEST(Safetensors, MmapFileWrittenByWriter) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  std::vector<float> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  const std::vector<std::int32_t> ids{5, 6};
  SafetensorsWriter w;
  w.add("weights", {10, 100}, v.data());
  w.add("ids", {2}, ids.data());
  w.set_metadata("format", "pt");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), w.to_bytes().size());

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  SafetensorsFile g = std::move(f);  // the mapping moves with the object
  EXPECT_EQ(g.read<float>("weights"), v);
  EXPECT_EQ(g.read<std::int32_t>("ids"), ids);
  EXPECT_EQ(g.metadata().at("format"), "pt");
  EXPECT_TRUE(g.contains("ids"));
  EXPECT_FALSE(g.contains("id"));

  // Overwriting goes through path.tmp + rename.
  SafetensorsWriter w2;
  w2.add("ids", {2}, ids.data());
  w2.write(path);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
  EXPECT_EQ(g.read<float>("weights"), v);  // the old mapping stays valid after the rename
}

TEST(Safetensors, ReadingABlockAndReleasingLeavesNoPageOfTheFileResident) {
  // Three 1 MB tensors. A block read in the middle one maps its pages and, through the
  // kernel's fault-around, cached neighbours that may lie in the tensor before; loading
  // must leave none of them resident beside the weights it filled.
  TempDir dir;
  const std::string path = dir / "blocks.safetensors";
  std::vector<float> v(1 << 18);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 1000);
  SafetensorsWriter w;
  for (const char* name : {"a", "b", "c"}) w.add(name, {512, 512}, v.data());
  w.write(path);
  const auto f = SafetensorsFile::open(path);
  std::vector<float> block(512 * 8);
  f.read_elements_into("b", 0, 512 * 8, block.data());  // rows [0, 8) of b: next to a
  EXPECT_EQ(block[0], 0.0f);
  EXPECT_EQ(block.back(), float((512 * 8 - 1) % 1000));
  const void* b = f.bytes("b").data();
  ASSERT_GT(resident_bytes_of_mapping(b), 0) << "the read mapped no page: this test would prove nothing";
  f.release_pages();
  EXPECT_EQ(resident_bytes_of_mapping(b), 0);
  // Blocks outside the tensor are refused, naming it.
  EXPECT_THAT(error_of<ldlm::CheckpointError>([&] { f.read_elements_into("b", 512 * 511, 513, block.data()); }),
              HasSubstr("tensor 'b' [512, 512] has 262144 elements, elements [261632, 262145) were asked for"));
}

TEST(Safetensors, OpenErrorsNameThePath) {
  TempDir dir;
  const std::string missing = dir / "missing.safetensors";
  EXPECT_THAT(error_of<ldlm::IoError>([&] { SafetensorsFile::open(missing); }),
              HasSubstr("safetensors " + missing + ": cannot open"));
  const std::string empty = dir / "empty.safetensors";
  std::ofstream(empty).close();
  EXPECT_THAT(error_of<ldlm::IoError>([&] { SafetensorsFile::open(empty); }),
              HasSubstr("safetensors " + empty + ": empty file"));
  const std::string sub = dir / "sub";
  fs::create_directories(sub);
  EXPECT_THAT(error_of<ldlm::IoError>([&] { SafetensorsFile::open(sub); }), HasSubstr("not a regular file"));
  const std::string short_file = dir / "short.safetensors";
  std::ofstream(short_file) << "abc";
  EXPECT_THAT(error_of<ldlm::FormatError>([&] { SafetensorsFile::open(short_file); }),
              HasSubstr("safetensors " + short_file + ": file is 3 bytes"));
}

TEST(Safetensors, WriteErrorNamesThePath) {
  TempDir dir;
  const std::string path = dir / "no_such_dir/out.safetensors";
  SafetensorsWriter w;
  EXPECT_THAT(error_of<ldlm::IoError>([&] { w.write(path); }), HasSubstr("safetensors " + path + ": cannot create"));
  // Renaming over a directory fails: the error names the path and the .tmp file is gone.
  const std::string sub = dir / "sub";
  fs::create_directories(sub);
  EXPECT_THAT(error_of<ldlm::IoError>([&] { w.write(sub); }), HasSubstr("safetensors " + sub + ": cannot rename"));
  EXPECT_FALSE(fs::exists(sub + ".tmp"));
}

#ifdef LDLM_TEST_DATA_DIR
// Every reference dump produced by the Python generator opens and reads.
TEST(Safetensors, OpensReferenceDumps) {
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(LDLM_TEST_DATA_DIR)) {
    if (e.path().extension() != ".safetensors") continue;
    const auto f = SafetensorsFile::open(e.path().string());
    for (const auto& t : f.tensors()) EXPECT_EQ(std::int64_t(f.read<double>(t.name).size()), t.numel()) << t.name;
    ++files;
  }
  EXPECT_GT(files, 0);
}
#endif

// ---------------------------------------------------------------------------
// Hostile inputs: one per rule, checking the message
// ---------------------------------------------------------------------------

const std::string kOne = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsHostile, TooShortForLength) {
  const auto msg = format_error(std::vector<std::byte>(5));
  EXPECT_THAT(msg, HasSubstr("safetensors <buffer>: file is 5 bytes, too short for the 8-byte header length"));
  EXPECT_THAT(format_error(std::vector<std::byte>{}), HasSubstr("file is 0 bytes"));
}

TEST(SafetensorsHostile, DataCutShort) {
  EXPECT_THAT(format_error(kOne, 6),
              HasSubstr("tensor 'x' data_offsets [0, 8] lie outside the data section of 6 bytes"));
}

TEST(SafetensorsHostile, HeaderLengthPastEnd) {
  auto buf = raw_file(kOne, 8);
  const std::size_t size = buf.size();
  buf[0] = std::byte(size);  // header length = file size > file size - 8
  EXPECT_THAT(format_error(std::move(buf)),
              HasSubstr("header length " + std::to_string(size) + " runs past the end of the file (" +
                        std::to_string(size - 8) + " bytes after the length prefix)"));
}

TEST(SafetensorsHostile, HeaderLengthOverLimit) {
  auto buf = raw_file("{}");
  const std::uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) buf[std::size_t(i)] = std::byte((n >> (8 * i)) & 0xff);
  EXPECT_THAT(format_error(buf), HasSubstr("header length 100000001 exceeds the limit of 100000000 bytes"));
  for (int i = 0; i < 8; ++i) buf[std::size_t(i)] = std::byte{0xff};
  EXPECT_THAT(format_error(std::move(buf)), HasSubstr("header length 18446744073709551615 exceeds the limit"));
}

TEST(SafetensorsHostile, NotJson) {
  EXPECT_THAT(format_error("{\"x\": nope}", 0), HasSubstr("safetensors <buffer>: header: not valid JSON"));
  EXPECT_THAT(format_error("", 0), HasSubstr("header: not valid JSON"));
  EXPECT_THAT(format_error("{} {}", 0), HasSubstr("header: not valid JSON"));
  EXPECT_THAT(format_error("{\"\xff\":1}", 0), HasSubstr("header: not valid JSON"));
}

TEST(SafetensorsHostile, NotAnObject) {
  EXPECT_THAT(format_error("[1, 2]", 0), HasSubstr("header is not a JSON object"));
  EXPECT_THAT(format_error("42      ", 0), HasSubstr("header is not a JSON object"));
}

TEST(SafetensorsHostile, DeepNesting) {
  // A million open brackets must be rejected at depth 16, not recurse or buffer them all.
  EXPECT_THAT(format_error(std::string(1'000'000, '['), 0),
              HasSubstr("safetensors <buffer>: header: JSON is nested deeper than 16 levels"));
  EXPECT_THAT(format_error(R"({"__metadata__":{"a":)" + std::string(15, '[') + "1" + std::string(15, ']') + "}}", 0),
              HasSubstr("nested deeper than 16 levels at '__metadata__.a"));
}

TEST(SafetensorsHostile, DuplicateTensorNames) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THAT(format_error(h, 8), HasSubstr("duplicate tensor name 'x'"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0),
              HasSubstr("header: duplicate key 'dtype' in 'x'"));
  EXPECT_THAT(format_error(R"({"__metadata__":{},"__metadata__":{}})", 0), HasSubstr("duplicate key '__metadata__'"));
}

TEST(SafetensorsHostile, OffsetsOutsideDataSection) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}})";
  EXPECT_THAT(format_error(h, 8),
              HasSubstr("tensor 'x' data_offsets [100, 104] lie outside the data section of 8 bytes"));
  const std::string wrap =
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})";
  EXPECT_THAT(format_error(wrap, 8), HasSubstr("lie outside the data section"));
}

TEST(SafetensorsHostile, OverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_THAT(format_error(h, 12), HasSubstr("tensor 'b' data_offsets [4, 12] overlap tensor 'a' ending at 8"));
}

TEST(SafetensorsHostile, GapBetweenTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_THAT(format_error(h, 12),
              HasSubstr("gap of 4 bytes before tensor 'b' data_offsets [8, 12] (previous tensor 'a' ends at 4)"));
  const std::string first = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THAT(format_error(first, 8), HasSubstr("gap of 4 bytes before tensor 'a'"));
}

TEST(SafetensorsHostile, TrailingBytes) {
  EXPECT_THAT(format_error(kOne, 11),
              HasSubstr("3 trailing bytes after the last tensor (data section is 11 bytes, tensors cover 8)"));
  EXPECT_THAT(format_error("{}", 1), HasSubstr("1 trailing bytes"));
}

TEST(SafetensorsHostile, BeginAfterEnd) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})";
  EXPECT_THAT(format_error(h, 8), HasSubstr("tensor 'x' data_offsets [8, 4] has begin > end"));
}

TEST(SafetensorsHostile, UnknownDtype) {
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("tensor 'x' has unknown dtype 'F8_E4M3'"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":3,"shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("tensor 'x' dtype is not a string"));
  EXPECT_THAT(error_of<ldlm::FormatError>([] { ldlm::parse_dtype("U16", "w"); }),
              HasSubstr("unknown dtype 'U16' for tensor 'w'"));
  EXPECT_EQ(ldlm::parse_dtype("BF16"), DType::BF16);
}

TEST(SafetensorsHostile, BadShapeEntries) {
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'x' shape entry 0 (-1) is not a non-negative 64-bit integer"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1,1.5],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'x' shape entry 1 (1.5) is not a non-negative"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8),
              HasSubstr("shape entry 0 (\"2\")"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", 4),
              HasSubstr("shape entry 0 (9223372036854775808)"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'x' has rank 9, more than 8"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":{},"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'x' shape is not an array"));
}

TEST(SafetensorsHostile, MalformedEntries) {
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1]}})", 0),
              HasSubstr("tensor 'x' entry must be an object with exactly the keys dtype, shape and data_offsets"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4),
              HasSubstr("tensor 'x' entry must be an object"));
  EXPECT_THAT(format_error(R"({"x":[1]})", 0), HasSubstr("tensor 'x' entry must be an object"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 4),
              HasSubstr("tensor 'x' data_offsets must be an array of two unsigned integers, got [0,-4]"));
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8),
              HasSubstr("data_offsets must be an array of two unsigned integers"));
}

TEST(SafetensorsHostile, SizeMismatch) {
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F64","shape":[2,3],"data_offsets":[0,24]}})", 24),
              HasSubstr("tensor 'x' shape [2, 3] with dtype F64 needs 48 bytes, but data_offsets [0, 24] span 24"));
}

TEST(SafetensorsHostile, ShapeProductOverflow) {
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
              HasSubstr("tensor 'x' shape [4294967296, 4294967296] x 4 bytes overflows 64 bits"));
  // Wrapping to exactly 0 must not sneak through: 2^62 * 4 bytes = 2^64.
  EXPECT_THAT(format_error(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
              HasSubstr("overflows 64 bits"));
  // A zero extent makes the product 0 even if earlier extents overflowed.
  const auto f = SafetensorsFile::from_buffer(
      raw_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"));
  EXPECT_EQ(f.info("x").numel(), 0);
}

TEST(SafetensorsHostile, MetadataNotStringToString) {
  EXPECT_THAT(format_error(R"({"__metadata__":{"a":"b","n":1}})", 0),
              HasSubstr("__metadata__ value of key 'n' is not a string"));
  EXPECT_THAT(format_error(R"({"__metadata__":["a"]})", 0), HasSubstr("__metadata__ is not an object"));
}

TEST(SafetensorsHostile, MissingTensor) {
  const auto f = SafetensorsFile::from_buffer(raw_file(kOne, 8));
  EXPECT_THAT(error_of<ldlm::CheckpointError>([&] { f.info("y"); }), HasSubstr("safetensors <buffer>: no tensor 'y'"));
  EXPECT_THAT(error_of<ldlm::CheckpointError>([&] { f.read<float>("y"); }), HasSubstr("no tensor 'y'"));
}

TEST(SafetensorsHostile, ReadFloatAsInt) {
  const auto f = SafetensorsFile::from_buffer(raw_file(kOne, 8));
  EXPECT_THAT(error_of<ldlm::FormatError>([&] { f.read<std::int64_t>("x"); }),
              HasSubstr("safetensors <buffer>: tensor 'x' has dtype F32, expected an integer dtype"));
}

}  // namespace
}  // namespace unit_io_safetensors
