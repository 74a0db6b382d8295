// Safetensors files: header parsing and memory-mapped tensor access (format: an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then
// the data section).
//
// Every header is validated before any tensor is handed out: a header length that fits the file
// (and at most 100 MB, as the reference implementation allows), a JSON object whose entries each
// have a known dtype, a shape of exact non-negative integers, and data_offsets [begin, end] inside
// the data section with end - begin == numel * dtype size (computed without overflow), and no two
// tensors overlapping. Gaps between tensors are allowed. "__metadata__" must map strings to
// strings. Errors name the file and the tensor.
//
// A SafetensorsFile owns its read-only private mapping; TensorViews point into it and stay valid
// while the file object lives. Thread-safe after Open (read-only).
#ifndef K3SERVE_MODEL_SAFETENSORS_H_
#define K3SERVE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

enum class DType : uint8_t {
  kBf16, kF16, kF32, kF64, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2,
  kU16, kU32, kU64, kF8E8M0,  // also in real checkpoints (e.g. MX scales), though unused here
};

std::string_view DTypeName(DType dtype);  // as in safetensors: "BF16", "F32", ...
size_t DTypeSize(DType dtype);
// InvalidArgument for a name the format does not define.
absl::StatusOr<DType> ParseDType(std::string_view name);

struct TensorView {
  std::string name;  // as stored in the file
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // not owned; may be unaligned
  size_t bytes = 0;
  std::string file;  // path of the file holding it, for error messages

  int64_t numel() const;
};

struct TensorInfo {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;  // offsets relative to the data section
  uint64_t end;
};

// Parses and validates a header (the JSON text only) against a data section of `data_size` bytes.
// Exposed for tests and the fuzzer; `file` is only used in messages.
absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensorsHeader(std::string_view json,
                                                                         uint64_t data_size,
                                                                         std::string_view file);

// Reads and validates only the header of the file at `path` (the 8-byte length and the JSON), not
// the data: offsets are checked against each other but not against the file's length, so a
// headers-only file (as WriteSafetensorsStreaming writes without `produce`) reads like a whole one.
// For tools that plan from shapes alone (tools/memory_plan.h).
absl::StatusOr<std::map<std::string, TensorInfo>> ReadSafetensorsHeader(const std::string& path);

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // NotFound when absent.
  absl::StatusOr<TensorView> Get(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section inside map_
  std::map<std::string, TensorInfo> tensors_;
};

// Writes a safetensors file. `tensors` are written in the given order, back to back (as the
// reference writer does, so its strict reader accepts the file); metadata is optional. The header is
// padded with spaces to a multiple of 8 bytes. The file appears atomically (written to PATH.tmp,
// then renamed).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian data, numel * DTypeSize(dtype) bytes
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The streaming form, for files too large to hold in memory: `specs` fixes the header, then
// `produce(i, &bytes)` is called for i = 0, 1, ... in order and must set `bytes` to tensor i's data
// (exactly numel * dtype size bytes). Without `produce` only the header is written: a headers-only
// file, which ReadSafetensorsHeader reads and SafetensorsFile::Open rejects.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
absl::Status WriteSafetensorsStreaming(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::function<absl::Status(size_t index, std::string* bytes)>& produce,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace k3

#endif  // K3SERVE_MODEL_SAFETENSORS_H_
