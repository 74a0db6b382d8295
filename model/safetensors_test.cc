#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file assembled by hand from the format's definition: 8-byte little-endian length, header, data.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string Bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 7 * i);
  return s;
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(SafetensorsTest, DTypes) {
  EXPECT_EQ(DTypeName(DType::kBf16), "BF16");
  EXPECT_EQ(DTypeSize(DType::kBf16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  for (const char* name : {"BF16", "F16", "F32", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL",
                           "F8_E4M3", "F8_E5M2", "U16", "U32", "U64", "F8_E8M0"}) {
    auto d = ParseDType(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_EQ(DTypeName(*d), name);
  }
  EXPECT_FALSE(ParseDType("bf16").ok());
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string path = TempPath("round_trip.safetensors");
  std::vector<TensorToWrite> tensors = {
      {"model.embed.weight", DType::kBf16, {3, 5}, Bytes(30, 1)},
      {"odd", DType::kU8, {3}, Bytes(3, 2)},
      {"model.bias", DType::kF32, {4}, Bytes(16, 3)},
      {"scalar", DType::kI64, {}, Bytes(8, 4)},
      {"empty", DType::kF16, {0, 7}, ""},
      {"weird \"name\"\n", DType::kI8, {2, 1}, Bytes(2, 5)},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  // Read the layout back by hand.
  std::string raw = ReadFile(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);
  ASSERT_LE(8 + header_len, raw.size());
  EXPECT_EQ(raw[8], '{');
  size_t data_bytes = 0;
  for (const auto& t : tensors) data_bytes += t.bytes.size();
  EXPECT_EQ(raw.size(), 8 + header_len + data_bytes);
  // Tensors are back to back in the given order.
  std::string expected_data;
  for (const auto& t : tensors) expected_data += t.bytes;
  EXPECT_EQ(raw.substr(8 + header_len), expected_data);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    auto view = (*file)->Get(t.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->name, t.name);
    EXPECT_EQ(view->dtype, t.dtype);
    EXPECT_EQ(view->shape, t.shape);
    EXPECT_EQ(view->file, path);
    EXPECT_EQ(static_cast<size_t>(view->numel()) * DTypeSize(t.dtype), t.bytes.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(view->data), view->bytes), t.bytes);
  }
  auto missing = (*file)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

TEST(SafetensorsTest, ReadsHandMadeFile) {
  // What the reference writer emits for {"a": f32[2], "b": bf16[1,2]} (plus padding).
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  float a[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(a), 8);
  data += std::string("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  const std::string path = TempPath("hand.safetensors");
  WriteFile(path, MakeFile(header, data));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto va = (*file)->Get("a");
  ASSERT_TRUE(va.ok());
  float back[2];
  std::memcpy(back, va->data, 8);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.25f);
  auto vb = (*file)->Get("b");
  ASSERT_TRUE(vb.ok());
  EXPECT_EQ(vb->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(vb->data[1], 0x3f);
}

TEST(SafetensorsTest, StreamingChecksProducedSizes) {
  const std::string path = TempPath("stream.safetensors");
  auto status = WriteSafetensorsStreaming(path, {{"t", DType::kF32, {2}}},
                                          [](size_t, std::string* bytes) {
                                            bytes->assign(7, 'x');
                                            return absl::OkStatus();
                                          });
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("'t'"), std::string::npos);
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());  // nothing left behind
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kU8, {1}, "x"}, {"a", DType::kU8, {1}, "y"}})
                   .ok());
}

struct BadFile {
  const char* what;
  std::string bytes;
  const char* message;  // expected part of the error (besides the path)
};

// A headers-only file: ReadSafetensorsHeader sees the whole layout, Open rejects the missing data.
TEST(SafetensorsTest, HeadersOnlyFiles) {
  const std::string path = TempPath("headers_only.safetensors");
  const std::vector<TensorSpec> specs = {{"a", DType::kBf16, {1000, 3000}},
                                         {"b", DType::kU8, {7, 16}}};
  ASSERT_TRUE(WriteSafetensorsStreaming(path, specs, nullptr).ok());
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->size(), 2u);
  EXPECT_EQ(header->at("a").end - header->at("a").begin, 6000000u);
  EXPECT_EQ(header->at("b").shape, (std::vector<int64_t>{7, 16}));
  EXPECT_LT(ReadFile(path).size(), 300u);
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());
  // The same reader on a whole file, and clear errors for broken ones.
  const std::string whole = TempPath("whole.safetensors");
  ASSERT_TRUE(WriteSafetensors(whole, {{"x", DType::kF32, {2}, Bytes(8, 1)}}).ok());
  auto x = ReadSafetensorsHeader(whole);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->at("x").end, 8u);
  WriteFile(path, ReadFile(path).substr(0, 20));
  auto cut = ReadSafetensorsHeader(path);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("ends inside its header"), std::string::npos);
  EXPECT_FALSE(ReadSafetensorsHeader(TempPath("absent.safetensors")).ok());
}

TEST(SafetensorsTest, BadFilesGiveClearErrors) {
  const std::string good_header =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data = Bytes(16, 9);
  auto header_with = [](const std::string& entry) { return "{" + entry + "}"; };
  std::vector<BadFile> cases = {
      {"tiny", "abc", "too short"},
      {"truncated data", MakeFile(good_header, data.substr(0, 10)), "'w'"},
      {"header length past the end",
       [&] {
         std::string f = MakeFile(good_header, data);
         f[0] = static_cast<char>(0xff);
         f[1] = static_cast<char>(0xff);
         return f;
       }(),
       "header length"},
      {"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + data,
       "header length"},
      {"bad json", MakeFile("{\"w\": [}", data), "bad safetensors header"},
      {"not an object", MakeFile("[1, 2, 3]", data), "not a JSON object"},
      {"offsets past data",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]})"), data),
       "'w': data_offsets [0, 32] do not lie within"},
      {"span mismatch",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]})"), data),
       "'w': data_offsets span 16 bytes but F32 [2, 3] needs 24"},
      {"reversed offsets",
       MakeFile(header_with(R"("w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]})"), data),
       "'w': data_offsets [8, 4]"},
      {"overlap",
       MakeFile(header_with(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})"),
                data),
       "overlap"},
      {"unknown dtype",
       MakeFile(header_with(R"("w":{"dtype":"F31","shape":[4],"data_offsets":[0,16]})"), data),
       "'w': unknown dtype \"F31\""},
      {"negative dim",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]})"), data),
       "'w': shape entry"},
      {"fractional offset",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16.5]})"), data),
       "'w': data_offsets[1] must be an integer"},
      {"string dim",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":["4"],"data_offsets":[0,16]})"), data),
       "'w': shape entry must be an integer, got string"},
      {"overflowing shape",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                            R"("data_offsets":[0,16]})"),
                data),
       "'w': shape [4294967296, 4294967296] overflows"},
      {"missing dtype", MakeFile(header_with(R"("w":{"shape":[4],"data_offsets":[0,16]})"), data),
       "'w': missing or non-string \"dtype\""},
      {"three offsets",
       MakeFile(header_with(R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]})"), data),
       "'w': missing \"data_offsets\""},
      {"entry not an object", MakeFile(header_with(R"("w":[1,2])"), data),
       "'w': entry must be an object"},
      {"bad metadata", MakeFile(header_with(R"("__metadata__":{"n":1})"), data), "__metadata__"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = TempPath("bad" + std::to_string(i) + ".safetensors");
    WriteFile(path, cases[i].bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << cases[i].what;
    const std::string message(file.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << cases[i].what << ": " << message;
    EXPECT_NE(message.find(cases[i].message), std::string::npos)
        << cases[i].what << ": expected \"" << cases[i].message << "\" in: " << message;
  }
  auto missing = SafetensorsFile::Open(TempPath("does_not_exist.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, GapsAndEmptyTensorsAreAccepted) {
  auto parsed = ParseSafetensorsHeader(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},)"
      R"("b":{"dtype":"U8","shape":[1],"data_offsets":[9,10]}})",
      10, "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 3u);
  EXPECT_EQ(parsed->at("b").begin, 9u);
}

// Invariants an accepted header must satisfy, checked independently of the parser's own logic.
void CheckAccepted(const std::map<std::string, TensorInfo>& tensors, uint64_t data_size) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : tensors) {
    ASSERT_LE(info.begin, info.end) << name;
    ASSERT_LE(info.end, data_size) << name;
    long double numel = 1;
    for (int64_t d : info.shape) {
      ASSERT_GE(d, 0);
      numel *= d;
    }
    ASSERT_EQ(static_cast<long double>(info.end - info.begin), numel * DTypeSize(info.dtype))
        << name;
    if (info.end > info.begin) ranges.emplace_back(info.begin, info.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) ASSERT_GE(ranges[i].first, ranges[i - 1].second);
}

TEST(SafetensorsTest, FuzzHeaderParser) {
  const std::string valid =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
      R"("c":{"dtype":"U8","shape":[],"data_offsets":[32,33]}})";
  const char* tokens[] = {"{",  "}",     "[",   "]",   ",",    ":",      "\"",  "0",
                          "-1", "1e400", "0.5", "null", "true", "\"F16\"", "\\u0000", "18446744073709551616",
                          "\xff", "9007199254740993", "[[[[[[[[", "{\"x\":"};
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    std::string text = valid;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      if (text.empty()) break;
      size_t pos = rng() % text.size();
      switch (rng() % 5) {
        case 0:
          text[pos] = static_cast<char>(rng());
          break;
        case 1:
          text.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          text.insert(pos, tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))]);
          break;
        case 3:
          if (std::isdigit(static_cast<unsigned char>(text[pos]))) {
            text[pos] = static_cast<char>('0' + rng() % 10);
          } else {
            text.insert(pos, std::to_string(rng() % 100));
          }
          break;
        default: {
          size_t len = 1 + rng() % 20;
          text.insert(pos, text.substr(rng() % text.size(), len));
        }
      }
    }
    const uint64_t data_size = rng() % 3 == 0 ? rng() % 64 : 33;
    auto parsed = ParseSafetensorsHeader(text, data_size, "fuzz");
    if (parsed.ok()) {
      ++accepted;
      CheckAccepted(*parsed, data_size);
    } else {
      EXPECT_FALSE(parsed.status().message().empty());
    }
  }
  EXPECT_GT(accepted, 0);  // the mutator sometimes keeps the header valid
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    if (iter % 2 == 0 && !text.empty()) text[0] = '{';
    auto parsed = ParseSafetensorsHeader(text, rng() % 100, "random");
    if (parsed.ok()) CheckAccepted(*parsed, 100);
  }
  // Deep nesting must fail cleanly, not overflow the stack.
  std::string deep = "{\"a\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  auto too_deep = ParseSafetensorsHeader(deep, 0, "deep");
  ASSERT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.status().message().find("nested deeper than 64 levels"), std::string::npos)
      << too_deep.status();
  // 64 levels (the object and 63 lists) parse; the entry is then refused for what it is.
  auto at_limit = [](int lists) {
    return "{\"a\":" + std::string(lists, '[') + std::string(lists, ']') + "}";
  };
  auto deepest = ParseSafetensorsHeader(at_limit(63), 0, "deep");
  ASSERT_FALSE(deepest.ok());
  EXPECT_NE(deepest.status().message().find("entry must be an object"), std::string::npos)
      << deepest.status();
  EXPECT_NE(ParseSafetensorsHeader(at_limit(64), 0, "deep").status().message().find("nested"),
            std::string::npos);
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += "{\"a\":";
  EXPECT_FALSE(ParseSafetensorsHeader(deep_objects, 0, "deep").ok());
}

TEST(SafetensorsTest, FuzzWholeFiles) {
  std::vector<TensorToWrite> tensors = {{"x", DType::kF32, {3}, Bytes(12, 1)},
                                        {"y", DType::kBf16, {2, 2}, Bytes(8, 2)}};
  const std::string path = TempPath("fuzz_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  const std::string valid = ReadFile(path);
  std::mt19937_64 rng(777);
  const std::string target = TempPath("fuzz.safetensors");
  for (int iter = 0; iter < 400; ++iter) {
    std::string bytes = valid;
    switch (iter % 3) {
      case 0:
        bytes.resize(rng() % bytes.size());
        break;
      case 1:
        bytes[rng() % 8] = static_cast<char>(rng());
        break;
      default:
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    WriteFile(target, bytes);
    auto file = SafetensorsFile::Open(target);
    if (!file.ok()) continue;
    for (const auto& [name, info] : (*file)->tensors()) {
      auto view = (*file)->Get(name);
      ASSERT_TRUE(view.ok());
      // Touch every byte: a view outside the mapping would fault.
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < view->bytes; ++i) sink = sink + view->data[i];
    }
  }
}

}  // namespace
}  // namespace k3
