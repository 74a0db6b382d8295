// The data-plane messages of a MoE layer step (sent over cluster/transport.h, never gRPC):
//
//   attention --MoeRequest-->  router --ExpertRequest-->  expert workers
//   attention <--MoeResponse-- router <--ExpertResponse-- expert workers
//
// Attention workers send at most one full-width row per token (the post_attention_layernorm
// output, d floats) and get back one row of ExpertWidth() floats; expert workers see only
// ExpertWidth() rows (d/2 for K3's LatentMoE). Every message starts with a version byte, a kind
// byte and a step id, so late answers of an abandoned step are recognized and dropped.
//
// Encoding (version 2), every field little-endian, independent of the compiler's struct layout:
//
//   header          u8 version (kMoeWireVersion), u8 kind (MoeMessageKind), u64 step_id
//   status          i32 code (absl::StatusCode), u32 n, n bytes of message
//   rows            zero bytes up to the next multiple of kMoeRowAlignment from the message start,
//                   then f32 rows[count * width]
//   traces          u32 n, n x (16 bytes trace id, 8 bytes span id, u8 flags): the W3C trace
//                   contexts of the traced requests among the rows (base/trace_context.h),
//                   each under the sender's span
//   MoeRequest      header, i32 layer, i64 tokens, i32 width, traces, rows
//   MoeResponse     header, status, i64 tokens, i32 width, rows if status OK
//   ExpertRequest   header, i32 layer, u64 placement_version, i64 rows_count, i32 width,
//                   i64 n, n x (i32 row, i32 expert, f32 weight), traces, rows
//   ExpertResponse  header, status, i64 rows_count, i32 width, rows if OK
//   kinds 5 and 6   an ExpertRequest or ExpertResponse whose rows travel on a device channel
//                   (rows_on_device): the same fields and padding, no rows
//
// The padding (new in version 2) lets the rows be read where they lie: a receiver's message
// buffer comes from the heap (16-byte aligned), so its float block is aligned too.
//
// Two ways in and out. Encode/Decode copy the rows from and into the structs below: for tests and
// rare paths. The data path writes and reads rows in place, so a token row is copied only where
// it must move (a router gathering a worker's rows): EncodeLeavingRows sizes the message and
// returns where its rows go, for the caller to compute them there; DecodeInPlace points at the
// rows inside the received bytes.
//
// f32 is the IEEE-754 binary32 bit pattern. Decode checks every count and index against the
// message size (negative or overflowing counts, truncation, trailing bytes, an assignment row
// outside [0, rows_count), an unknown version, kind or status code) and returns InvalidArgument
// naming the message and the problem. It reads the step id first, so a receiver can still answer a
// malformed request with its step id when the header was intact.
#ifndef K3SERVE_MOE_MOE_WIRE_H_
#define K3SERVE_MOE_MOE_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/trace_context.h"
#include "moe/expert_assignment.h"

namespace k3 {

// The wire version this build writes and the only one it reads.
inline constexpr uint8_t kMoeWireVersion = 2;
// Row blocks start at a multiple of this many bytes from the message start.
inline constexpr size_t kMoeRowAlignment = 16;

enum class MoeMessageKind : uint8_t {
  kMoeRequest = 1,
  kMoeResponse = 2,
  kExpertRequest = 3,
  kExpertResponse = 4,
  // An ExpertRequest or ExpertResponse with rows_on_device: the same fields, no rows (see
  // ExpertRequest::rows_on_device).
  kDeviceExpertRequest = 5,
  kDeviceExpertResponse = 6,
};

struct MoeRequest {
  uint64_t step_id = 0;
  int32_t layer = 0;
  int64_t tokens = 0;
  int32_t width = 0;        // hidden_size
  std::vector<float> rows;  // [tokens, width]
  std::vector<TraceContext> traces;  // usually none
};

// Errors travel as a status so the attention worker can end streams with the router's reason.
struct MoeResponse {
  uint64_t step_id = 0;
  absl::Status status;
  int64_t tokens = 0;
  int32_t width = 0;        // ExpertWidth()
  std::vector<float> rows;  // [tokens, width] when status is OK
};

struct ExpertRequest {
  uint64_t step_id = 0;
  int32_t layer = 0;
  uint64_t placement_version = 0;
  std::vector<ExpertAssignment> assignments;  // what to compute, on which rows
  int64_t rows_count = 0;
  int32_t width = 0;
  std::vector<float> rows;  // [rows_count, width]
  std::vector<TraceContext> traces;  // usually none
  // The rows are not in the message: right after sending it, the sender sends them (fp32
  // [rows_count, width]) on its device channel to the receiver (cluster/device_channel.h), and
  // the receiver takes them from there, in the order the messages arrived. Encoded as kind
  // kDeviceExpertRequest, whose message ends where the rows would begin; `rows` is not read.
  bool rows_on_device = false;
};

struct ExpertResponse {
  uint64_t step_id = 0;
  absl::Status status;
  int64_t rows_count = 0;
  int32_t width = 0;
  std::vector<float> rows;  // partial sums [rows_count, width] when status is OK
  // The answer to a request with rows_on_device (kind kDeviceExpertResponse): when status is OK,
  // the partial sums follow on the answering node's device channel to the requester. With an
  // error, rows_count says whether the node took the request's rows off its channel (the
  // request's rows_count) or not (0): then the requester's channel is out of step.
  bool rows_on_device = false;
};

// The kind of an encoded message; InvalidArgument when shorter than the version and kind bytes, or
// when either is unknown.
absl::StatusOr<MoeMessageKind> PeekMoeMessageKind(std::string_view bytes);

std::string Encode(const MoeRequest& message);
std::string Encode(const MoeResponse& message);
std::string Encode(const ExpertRequest& message);
std::string Encode(const ExpertResponse& message);

absl::Status Decode(std::string_view bytes, MoeRequest* message);
absl::Status Decode(std::string_view bytes, MoeResponse* message);
absl::Status Decode(std::string_view bytes, ExpertRequest* message);
absl::Status Decode(std::string_view bytes, ExpertResponse* message);

// In-place encoding: writes every field of `message` but its rows into *out (resized to the whole
// message; message.rows is not read) and returns where the rows go: tokens (rows_count) x width
// floats, to be filled before sending. A response whose status is not OK has no rows: nullptr.
float* EncodeLeavingRows(const MoeRequest& message, std::string* out);
float* EncodeLeavingRows(const MoeResponse& message, std::string* out);
float* EncodeLeavingRows(const ExpertRequest& message, std::string* out);
float* EncodeLeavingRows(const ExpertResponse& message, std::string* out);

// In-place decoding: checks `bytes` as Decode does and fills every field of *message but its rows
// (left empty); *rows points at them inside `bytes`, valid while those bytes live unchanged (an
// empty span for an error response). INVALID_ARGUMENT as for Decode, and when the rows are not
// float-aligned in memory (bytes not at a 4-byte aligned address; never the case for a heap
// buffer). Defined for the four message types above.
template <typename Message>
absl::Status DecodeInPlace(std::string_view bytes, Message* message,
                           absl::Span<const float>* rows);

}  // namespace k3

#endif  // K3SERVE_MOE_MOE_WIRE_H_
