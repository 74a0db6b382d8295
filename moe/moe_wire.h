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
// Encoding (version 1), every field little-endian with no padding, independent of the compiler's
// struct layout:
//
//   header          u8 version (kMoeWireVersion), u8 kind (MoeMessageKind), u64 step_id
//   status          i32 code (absl::StatusCode), u32 n, n bytes of message
//   MoeRequest      header, i32 layer, i64 tokens, i32 width, f32 rows[tokens * width]
//   MoeResponse     header, status, i64 tokens, i32 width, f32 rows[tokens * width] if status OK
//   ExpertRequest   header, i32 layer, u64 placement_version, i64 rows_count, i32 width,
//                   i64 n, n x (i32 row, i32 expert, f32 weight), f32 rows[rows_count * width]
//   ExpertResponse  header, status, i64 rows_count, i32 width, f32 rows[rows_count * width] if OK
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
#include "moe/expert_assignment.h"

namespace k3 {

// The wire version this build writes and the only one it reads.
inline constexpr uint8_t kMoeWireVersion = 1;

enum class MoeMessageKind : uint8_t {
  kMoeRequest = 1,
  kMoeResponse = 2,
  kExpertRequest = 3,
  kExpertResponse = 4,
};

struct MoeRequest {
  uint64_t step_id = 0;
  int32_t layer = 0;
  int64_t tokens = 0;
  int32_t width = 0;        // hidden_size
  std::vector<float> rows;  // [tokens, width]
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
  int64_t rows_count = 0;
  int32_t width = 0;
  std::vector<ExpertAssignment> assignments;
  std::vector<float> rows;  // [rows_count, width]
};

struct ExpertResponse {
  uint64_t step_id = 0;
  absl::Status status;
  int64_t rows_count = 0;
  int32_t width = 0;
  std::vector<float> rows;  // partial sums [rows_count, width] when status is OK
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

}  // namespace k3

#endif  // K3SERVE_MOE_MOE_WIRE_H_
