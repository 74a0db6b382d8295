#include "moe/moe_wire.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

ExpertRequest SampleDispatch() {
  return ExpertRequest{11, 2, 5, {{0, 4, 0.5f}, {1, 9, 0.25f}}, 2, 3, {1, 2, 3, 4, 5, 6}};
}

// SampleDispatch with its rows on a device channel.
ExpertRequest SampleDeviceDispatch() {
  ExpertRequest m = SampleDispatch();
  m.rows_on_device = true;
  return m;
}

ExpertResponse DeviceAnswer(absl::Status status) {
  ExpertResponse m{13, std::move(status), 2, 3, {}};
  m.rows_on_device = true;
  return m;
}

// One valid message of each kind, OK and failed responses both.
std::vector<std::string> SampleMessages() {
  MoeRequest traced{7, 3, 1, 2, {1, 2}, {}};
  traced.traces.push_back(TraceContext{{1, 2, 3}, {4, 5}, 1});
  return {Encode(MoeRequest{7, 3, 2, 4, {1, 2, 3, 4, 5, 6, 7, 8}}), Encode(traced),
          Encode(MoeResponse{8, absl::OkStatus(), 1, 2, {-1.5f, 2.5f}}),
          Encode(MoeResponse{9, absl::UnavailableError("expert worker 3 lost"), 0, 0, {}}),
          Encode(SampleDispatch()),
          Encode(ExpertResponse{11, absl::OkStatus(), 2, 3, {6, 5, 4, 3, 2, 1}}),
          Encode(ExpertResponse{12, absl::InternalError("boom"), 0, 0, {}}),
          Encode(SampleDeviceDispatch()), Encode(DeviceAnswer(absl::OkStatus())),
          Encode(DeviceAnswer(absl::InternalError("no channel")))};
}

// Decodes `bytes` as the kind its header names; InvalidArgument if it names none.
absl::Status DecodeAny(const std::string& bytes) {
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(bytes);
  if (!kind.ok()) return kind.status();
  switch (*kind) {
    case MoeMessageKind::kMoeRequest: {
      MoeRequest m;
      absl::Status s = Decode(bytes, &m);
      if (s.ok()) {
        EXPECT_EQ(m.rows.size(), static_cast<size_t>(m.tokens * m.width));
      }
      return s;
    }
    case MoeMessageKind::kMoeResponse: {
      MoeResponse m;
      absl::Status s = Decode(bytes, &m);
      if (s.ok() && m.status.ok()) {
        EXPECT_EQ(m.rows.size(), static_cast<size_t>(m.tokens * m.width));
      }
      return s;
    }
    case MoeMessageKind::kExpertRequest:
    case MoeMessageKind::kDeviceExpertRequest: {
      ExpertRequest m;
      absl::Status s = Decode(bytes, &m);
      if (s.ok()) {
        EXPECT_EQ(m.rows_on_device, *kind == MoeMessageKind::kDeviceExpertRequest);
        EXPECT_EQ(m.rows.size(),
                  m.rows_on_device ? 0u : static_cast<size_t>(m.rows_count * m.width));
        for (const ExpertAssignment& a : m.assignments) {
          EXPECT_GE(a.row, 0);
          EXPECT_LT(a.row, m.rows_count);
        }
      }
      return s;
    }
    case MoeMessageKind::kExpertResponse:
    case MoeMessageKind::kDeviceExpertResponse: {
      ExpertResponse m;
      absl::Status s = Decode(bytes, &m);
      if (s.ok()) {
        EXPECT_EQ(m.rows_on_device, *kind == MoeMessageKind::kDeviceExpertResponse);
      }
      if (s.ok() && m.status.ok()) {
        EXPECT_EQ(m.rows.size(),
                  m.rows_on_device ? 0u : static_cast<size_t>(m.rows_count * m.width));
      }
      return s;
    }
  }
  return absl::InternalError("unreachable");
}

// Overwrites the little-endian integer at `offset`.
template <typename T>
void Patch(std::string* bytes, size_t offset, T value) {
  const auto bits = static_cast<std::make_unsigned_t<T>>(value);
  for (size_t i = 0; i < sizeof(T); ++i) (*bytes)[offset + i] = static_cast<char>(bits >> (8 * i));
}

// Field offsets of an ExpertRequest (moe_wire.h): the header is 10 bytes.
constexpr size_t kRowsCountAt = 22, kWidthAt = 30, kAssignmentCountAt = 34, kFirstAssignmentAt = 42;

TEST(MoeWireTest, RoundTripsEveryMessage) {
  MoeRequest request{7, 3, 2, 4, {1, 2, 3, 4, 5, 6, 7, 8}};
  MoeRequest request_back;
  ASSERT_TRUE(Decode(Encode(request), &request_back).ok());
  EXPECT_EQ(request_back.step_id, 7u);
  EXPECT_EQ(request_back.layer, 3);
  EXPECT_EQ(request_back.tokens, 2);
  EXPECT_EQ(request_back.width, 4);
  EXPECT_EQ(request_back.rows, request.rows);

  MoeResponse failed{9, absl::UnavailableError("expert worker 3 lost"), 0, 0, {}};
  MoeResponse failed_back;
  ASSERT_TRUE(Decode(Encode(failed), &failed_back).ok());
  EXPECT_EQ(failed_back.step_id, 9u);
  EXPECT_EQ(failed_back.status, failed.status);

  MoeResponse answered{10, absl::OkStatus(), 1, 2, {-1.5f, 2.5f}};
  MoeResponse answered_back;
  ASSERT_TRUE(Decode(Encode(answered), &answered_back).ok());
  EXPECT_TRUE(answered_back.status.ok());
  EXPECT_EQ(answered_back.tokens, 1);
  EXPECT_EQ(answered_back.width, 2);
  EXPECT_EQ(answered_back.rows, answered.rows);

  const ExpertRequest dispatch = SampleDispatch();
  ExpertRequest dispatch_back;
  ASSERT_TRUE(Decode(Encode(dispatch), &dispatch_back).ok());
  EXPECT_EQ(dispatch_back.step_id, 11u);
  EXPECT_EQ(dispatch_back.layer, 2);
  EXPECT_EQ(dispatch_back.placement_version, 5u);
  EXPECT_EQ(dispatch_back.rows_count, 2);
  EXPECT_EQ(dispatch_back.width, 3);
  ASSERT_EQ(dispatch_back.assignments.size(), 2u);
  EXPECT_EQ(dispatch_back.assignments[0].row, 0);
  EXPECT_EQ(dispatch_back.assignments[0].expert, 4);
  EXPECT_EQ(dispatch_back.assignments[0].weight, 0.5f);
  EXPECT_EQ(dispatch_back.assignments[1].row, 1);
  EXPECT_EQ(dispatch_back.assignments[1].expert, 9);
  EXPECT_EQ(dispatch_back.assignments[1].weight, 0.25f);
  EXPECT_EQ(dispatch_back.rows, dispatch.rows);

  ExpertResponse answer{11, absl::OkStatus(), 2, 3, {6, 5, 4, 3, 2, 1}};
  ExpertResponse answer_back;
  ASSERT_TRUE(Decode(Encode(answer), &answer_back).ok());
  EXPECT_EQ(answer_back.step_id, 11u);
  EXPECT_EQ(answer_back.rows_count, 2);
  EXPECT_EQ(answer_back.width, 3);
  EXPECT_EQ(answer_back.rows, answer.rows);

  // Empty messages are valid too.
  ExpertResponse nothing;
  ExpertResponse nothing_back;
  ASSERT_TRUE(Decode(Encode(nothing), &nothing_back).ok());
  EXPECT_TRUE(nothing_back.rows.empty());
}

// The byte layout written out by hand from moe_wire.h, so that a change of the encoding (or a
// compiler laying structs out differently) cannot pass unnoticed.
TEST(MoeWireTest, ExpertRequestGoldenBytes) {
  ExpertRequest m{0x0102030405060708u, 2, 5, {{0, 9, 0.5f}}, 1, 2, {1.0f, -2.0f}};
  const unsigned char golden[] = {
      0x02,                                            // version
      0x03,                                            // kind: ExpertRequest
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // step_id
      0x02, 0x00, 0x00, 0x00,                          // layer
      0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // placement_version
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // rows_count
      0x02, 0x00, 0x00, 0x00,                          // width
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // assignment count
      0x00, 0x00, 0x00, 0x00,                          // row
      0x09, 0x00, 0x00, 0x00,                          // expert
      0x00, 0x00, 0x00, 0x3f,                          // weight 0.5f
      0x00, 0x00, 0x00, 0x00,                          // trace count
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00,              // padding from offset 58 to 64
      0x00, 0x00, 0x80, 0x3f,                          // 1.0f
      0x00, 0x00, 0x00, 0xc0,                          // -2.0f
  };
  const std::string expected(reinterpret_cast<const char*>(golden), sizeof(golden));
  EXPECT_EQ(Encode(m), expected);
  ExpertRequest back;
  ASSERT_TRUE(Decode(expected, &back).ok());
  EXPECT_EQ(back.step_id, m.step_id);
  EXPECT_EQ(back.assignments[0].expert, 9);
  EXPECT_EQ(back.rows, m.rows);
}

// A device request is an ExpertRequest of kind 5 that ends where its rows would begin.
TEST(MoeWireTest, DeviceExpertRequestGoldenBytes) {
  ExpertRequest m{0x0102030405060708u, 2, 5, {{0, 9, 0.5f}}, 1, 2, {1.0f, -2.0f}};
  m.rows_on_device = true;
  const unsigned char golden[] = {
      0x02,                                            // version
      0x05,                                            // kind: ExpertRequest, rows on device
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // step_id
      0x02, 0x00, 0x00, 0x00,                          // layer
      0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // placement_version
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // rows_count
      0x02, 0x00, 0x00, 0x00,                          // width
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // assignment count
      0x00, 0x00, 0x00, 0x00,                          // row
      0x09, 0x00, 0x00, 0x00,                          // expert
      0x00, 0x00, 0x00, 0x3f,                          // weight 0.5f
      0x00, 0x00, 0x00, 0x00,                          // trace count
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00,              // padding from offset 58 to 64; no rows
  };
  const std::string expected(reinterpret_cast<const char*>(golden), sizeof(golden));
  EXPECT_EQ(Encode(m), expected);
  std::string leaving;
  EXPECT_EQ(EncodeLeavingRows(m, &leaving), nullptr);
  EXPECT_EQ(leaving, expected);
  ExpertRequest back;
  ASSERT_TRUE(Decode(expected, &back).ok());
  EXPECT_TRUE(back.rows_on_device);
  EXPECT_EQ(back.rows_count, 1);
  EXPECT_EQ(back.width, 2);
  EXPECT_EQ(back.assignments[0].expert, 9);
  EXPECT_TRUE(back.rows.empty());
  // The same bytes as an inline request lack their rows.
  std::string inline_kind = expected;
  inline_kind[1] = 0x03;
  EXPECT_EQ(Decode(inline_kind, &back).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MoeWireTest, DeviceExpertResponseGoldenBytes) {
  const unsigned char golden[] = {
      0x02,                                            // version
      0x06,                                            // kind: ExpertResponse, rows on device
      0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // step_id 13
      0x00, 0x00, 0x00, 0x00,                          // code: OK
      0x00, 0x00, 0x00, 0x00,                          // message size
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // rows_count
      0x03, 0x00, 0x00, 0x00,                          // width
      0x00, 0x00,                                      // padding from offset 30 to 32; no rows
  };
  const std::string expected(reinterpret_cast<const char*>(golden), sizeof(golden));
  EXPECT_EQ(Encode(DeviceAnswer(absl::OkStatus())), expected);
  ExpertResponse back;
  ASSERT_TRUE(Decode(expected, &back).ok());
  EXPECT_TRUE(back.rows_on_device);
  EXPECT_TRUE(back.status.ok());
  EXPECT_EQ(back.rows_count, 2);
  EXPECT_EQ(back.width, 3);
  EXPECT_TRUE(back.rows.empty());
  // An inline response of that size would carry 6 floats.
  std::string inline_kind = expected;
  inline_kind[1] = 0x04;
  EXPECT_EQ(Decode(inline_kind, &back).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MoeWireTest, MoeResponseGoldenBytes) {
  MoeResponse m{7, absl::UnavailableError("down"), 0, 0, {}};
  const unsigned char golden[] = {
      0x02,                                            // version
      0x02,                                            // kind: MoeResponse
      0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // step_id
      0x0e, 0x00, 0x00, 0x00,                          // code: UNAVAILABLE (14)
      0x04, 0x00, 0x00, 0x00,                          // message size
      'd',  'o',  'w',  'n',                           // message
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // tokens
      0x00, 0x00, 0x00, 0x00,                          // width (no rows: the status is an error)
  };
  const std::string expected(reinterpret_cast<const char*>(golden), sizeof(golden));
  EXPECT_EQ(Encode(m), expected);
  MoeResponse back;
  ASSERT_TRUE(Decode(expected, &back).ok());
  EXPECT_EQ(back.status, m.status);
}

TEST(MoeWireTest, EveryTruncationIsRejected) {
  for (const std::string& good : SampleMessages()) {
    ASSERT_TRUE(DecodeAny(good).ok());
    for (size_t cut = 0; cut < good.size(); ++cut) {
      EXPECT_EQ(DecodeAny(good.substr(0, cut)).code(), absl::StatusCode::kInvalidArgument)
          << "kind " << static_cast<int>(good[1]) << " cut at " << cut;
    }
  }
}

TEST(MoeWireTest, TrailingBytesAreRejected) {
  for (const std::string& good : SampleMessages()) {
    absl::Status s = DecodeAny(good + '\0');
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("1 trailing bytes"), std::string::npos) << s;
  }
}

TEST(MoeWireTest, UnknownVersionAndKindAreRejected) {
  std::string bytes = Encode(SampleDispatch());
  bytes[0] = 1;  // the version before aligned row blocks
  EXPECT_FALSE(PeekMoeMessageKind(bytes).ok());
  ExpertRequest back;
  absl::Status s = Decode(bytes, &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsupported wire version 1"), std::string::npos) << s;

  MoeRequest wrong_kind;
  EXPECT_FALSE(Decode(Encode(SampleDispatch()), &wrong_kind).ok());
  EXPECT_FALSE(PeekMoeMessageKind("").ok());
  EXPECT_FALSE(PeekMoeMessageKind(std::string(1, '\x02')).ok());
  EXPECT_FALSE(PeekMoeMessageKind(std::string("\x02\x07", 2)).ok());
  EXPECT_FALSE(PeekMoeMessageKind(std::string("\x02\x00", 2)).ok());
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(Encode(SampleDispatch()));
  ASSERT_TRUE(kind.ok());
  EXPECT_EQ(*kind, MoeMessageKind::kExpertRequest);
}

TEST(MoeWireTest, BadCountsAreRejectedWithoutAllocating) {
  const std::string good = Encode(SampleDispatch());
  // Returns the error message.
  auto rejects = [](const std::string& bytes, const std::string& why) {
    ExpertRequest back;
    absl::Status s = Decode(bytes, &back);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why;
    return std::string(s.message());
  };
  std::string bytes = good;
  Patch<int64_t>(&bytes, kAssignmentCountAt, std::numeric_limits<int64_t>::max());
  rejects(bytes, "assignment count past the message");
  bytes = good;
  Patch<int64_t>(&bytes, kAssignmentCountAt, -1);
  rejects(bytes, "negative assignment count");
  bytes = good;
  Patch<int64_t>(&bytes, kRowsCountAt, std::numeric_limits<int64_t>::max());
  Patch<int32_t>(&bytes, kWidthAt, std::numeric_limits<int32_t>::max());
  rejects(bytes, "rows_count x width overflows");
  bytes = good;
  Patch<int64_t>(&bytes, kRowsCountAt, int64_t{1} << 40);
  Patch<int32_t>(&bytes, kWidthAt, 1 << 24);
  rejects(bytes, "rows of 2^64 floats");
  bytes = good;
  Patch<int64_t>(&bytes, kRowsCountAt, -2);
  rejects(bytes, "negative rows_count");
  bytes = good;
  Patch<int32_t>(&bytes, kWidthAt, -3);
  rejects(bytes, "negative width");
  bytes = good;
  Patch<int32_t>(&bytes, kFirstAssignmentAt, 2);
  const std::string why = rejects(bytes, "assignment row past rows_count");
  EXPECT_NE(why.find("assignment row 2 outside [0, 2)"), std::string::npos) << why;
  bytes = good;
  Patch<int32_t>(&bytes, kFirstAssignmentAt, -1);
  rejects(bytes, "negative assignment row");

  // The fields before the failure are still read: the step id lets a worker answer the router.
  ExpertRequest back;
  EXPECT_FALSE(Decode(bytes, &back).ok());
  EXPECT_EQ(back.step_id, 11u);
  EXPECT_EQ(back.layer, 2);

  std::string response = Encode(MoeResponse{9, absl::InternalError("x"), 0, 0, {}});
  Patch<int32_t>(&response, 10, 99);
  MoeResponse response_back;
  absl::Status s = Decode(response, &response_back);
  EXPECT_NE(s.message().find("bad status code 99"), std::string::npos) << s;
  response = Encode(MoeResponse{9, absl::InternalError("x"), 0, 0, {}});
  Patch<uint32_t>(&response, 14, 0xffffffffu);
  EXPECT_EQ(Decode(response, &response_back).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MoeWireTest, TraceContextsTravelWithRequests) {
  const TraceContext a =
      ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").value();
  const TraceContext b = a.WithSpan(NewSpanId());
  MoeRequest request{7, 3, 1, 2, {1, 2}, {a, b}};
  MoeRequest request_back;
  ASSERT_TRUE(Decode(Encode(request), &request_back).ok());
  EXPECT_EQ(request_back.traces, request.traces);
  EXPECT_EQ(request_back.rows, request.rows);
  ExpertRequest dispatch = SampleDispatch();
  dispatch.traces = {b};
  ExpertRequest dispatch_back;
  absl::Span<const float> rows;
  const std::string bytes = Encode(dispatch);
  ASSERT_TRUE(DecodeInPlace(bytes, &dispatch_back, &rows).ok());
  EXPECT_EQ(dispatch_back.traces, dispatch.traces);
  EXPECT_EQ(std::vector<float>(rows.begin(), rows.end()), dispatch.rows);
  // A trace count past the message is rejected like any other count.
  std::string cut = Encode(request);
  Patch<uint32_t>(&cut, 10 + 4 + 8 + 4, 1000);
  EXPECT_EQ(Decode(cut, &request_back).code(), absl::StatusCode::kInvalidArgument);
}

// Messages built in place equal the ones Encode copies the rows into, and read in place give the
// rows Decode copies out, at a float-aligned address inside the message.
TEST(MoeWireTest, InPlaceEncodingAndDecodingMatchTheCopyingOnes) {
  const MoeRequest request{7, 3, 2, 4, {1, 2, 3, 4, 5, 6, 7, 8}};
  const MoeResponse response{8, absl::OkStatus(), 1, 2, {-1.5f, 2.5f}};
  const ExpertRequest dispatch = SampleDispatch();
  const ExpertResponse answer{11, absl::OkStatus(), 2, 3, {6, 5, 4, 3, 2, 1}};
  auto check = [](const auto& message) {
    auto header = message;
    header.rows.clear();  // EncodeLeavingRows must not read them
    std::string built;
    float* rows = EncodeLeavingRows(header, &built);
    ASSERT_NE(rows, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rows) % alignof(float), 0u);
    EXPECT_EQ((reinterpret_cast<const char*>(rows) - built.data()) % kMoeRowAlignment, 0u);
    std::copy(message.rows.begin(), message.rows.end(), rows);
    const std::string copied = Encode(message);
    EXPECT_EQ(built, copied);

    auto back = message;
    absl::Span<const float> in_place;
    ASSERT_TRUE(DecodeInPlace(copied, &back, &in_place).ok());
    EXPECT_TRUE(back.rows.empty());
    EXPECT_EQ(std::vector<float>(in_place.begin(), in_place.end()), message.rows);
    EXPECT_GE(reinterpret_cast<const char*>(in_place.data()), copied.data());
    EXPECT_LE(reinterpret_cast<const char*>(in_place.data() + in_place.size()),
              copied.data() + copied.size());
    EXPECT_EQ(back.step_id, message.step_id);
  };
  check(request);
  check(response);
  check(dispatch);
  check(answer);

  // A failed response has no rows either way.
  std::string failed;
  EXPECT_EQ(EncodeLeavingRows(MoeResponse{9, absl::InternalError("x"), 3, 4, {}}, &failed),
            nullptr);
  MoeResponse failed_back;
  absl::Span<const float> none;
  ASSERT_TRUE(DecodeInPlace(failed, &failed_back, &none).ok());
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(failed_back.status.code(), absl::StatusCode::kInternal);
}

TEST(MoeWireTest, InPlaceDecodingRejectsMisalignedRowsAndPadding) {
  const std::string good = Encode(SampleDispatch());
  // The same bytes one past a float boundary: the copying decoder still reads them.
  std::string shifted = " " + good;
  const std::string_view misaligned(shifted.data() + 1, good.size());
  ExpertRequest back;
  absl::Span<const float> rows;
  absl::Status s = DecodeInPlace(misaligned, &back, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s;
  EXPECT_TRUE(Decode(misaligned, &back).ok());
  EXPECT_EQ(back.rows, SampleDispatch().rows);

  // SampleDispatch's 24 assignment bytes end at offset 66, its trace count at 70; the rows start
  // at 80.
  std::string padded = good;
  padded[70] = 1;
  s = Decode(padded, &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("nonzero padding at offset 70"), std::string::npos) << s;
}

// Random corruptions of valid messages and random garbage decode to an error or to a message
// whose sizes agree with its rows; never a crash (run under ASan in CI).
TEST(MoeWireTest, RandomMutationsFailCleanly) {
  std::mt19937 rng(1);
  for (const std::string& good : SampleMessages()) {
    for (int trial = 0; trial < 3000; ++trial) {
      std::string bad = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
      if (rng() % 4 == 0) bad.resize(rng() % (bad.size() + 8), static_cast<char>(rng()));
      DecodeAny(bad).IgnoreError();
    }
  }
  for (int trial = 0; trial < 3000; ++trial) {
    std::string garbage(rng() % 96, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    if (garbage.size() >= 2) {
      garbage[0] = static_cast<char>(kMoeWireVersion);
      garbage[1] = static_cast<char>(1 + rng() % 4);
    }
    DecodeAny(garbage).IgnoreError();
  }
}

}  // namespace
}  // namespace k3
