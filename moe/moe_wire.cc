#include "moe/moe_wire.h"

#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

// Rows travel as one memcpy of the float block: on a little-endian host the in-memory bytes of a
// float are its little-endian wire bytes. A big-endian port would swap them here.
static_assert(std::endian::native == std::endian::little,
              "moe_wire copies float rows as little-endian bytes");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4);

constexpr size_t kHeaderBytes = 1 + 1 + 8;      // version, kind, step_id
constexpr size_t kAssignmentBytes = 4 + 4 + 4;  // row, expert, weight
constexpr size_t kStatusBytes = 4 + 4;          // code, message size (then the message)
constexpr size_t kTraceBytes = 16 + 8 + 1;      // trace id, span id, flags

size_t TracesBytes(const std::vector<TraceContext>& traces) {
  return 4 + traces.size() * kTraceBytes;
}

size_t StatusBytes(const absl::Status& status) { return kStatusBytes + status.message().size(); }

// One integer at p, least significant byte first. The byte loops compile to single moves on x86.
template <typename T>
void StoreLe(char* p, T value) {
  static_assert(std::is_integral_v<T>);
  const auto bits = static_cast<std::make_unsigned_t<T>>(value);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<char>(bits >> (8 * i));
}
template <typename T>
T LoadLe(const char* p) {
  static_assert(std::is_integral_v<T>);
  std::make_unsigned_t<T> bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    bits |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return static_cast<T>(bits);
}

// The offset of a row block that follows `prefix` bytes of fields.
size_t RowsOffset(size_t prefix) {
  return (prefix + kMoeRowAlignment - 1) / kMoeRowAlignment * kMoeRowAlignment;
}

// Writes fields into a buffer sized in advance by the caller (no reallocation while encoding).
class Writer {
 public:
  Writer(std::string* out, size_t size, MoeMessageKind kind, uint64_t step_id) : out_(out) {
    out_->resize(size);
    p_ = out_->data();
    Put<uint8_t>(kMoeWireVersion);
    Put<uint8_t>(static_cast<uint8_t>(kind));
    Put<uint64_t>(step_id);
  }
  template <typename T>
  void Put(T value) {
    StoreLe(p_, value);
    p_ += sizeof(T);
  }
  void PutFloat(float value) { Put(std::bit_cast<uint32_t>(value)); }
  void PutBytes(const void* data, size_t size) {
    if (size > 0) std::memcpy(p_, data, size);  // data may be null when size is 0
    p_ += size;
  }
  void PutStatus(const absl::Status& status) {
    Put(static_cast<int32_t>(status.code()));
    Put(static_cast<uint32_t>(status.message().size()));
    PutBytes(status.message().data(), status.message().size());
  }
  void PutTraces(const std::vector<TraceContext>& traces) {
    Put(static_cast<uint32_t>(traces.size()));
    for (const TraceContext& t : traces) {
      PutBytes(t.trace_id.data(), t.trace_id.size());
      PutBytes(t.span_id.data(), t.span_id.size());
      Put(t.flags);
    }
  }
  // Pads to the row block and leaves `floats` floats there for the caller; returns their start.
  float* LeaveRows(size_t floats) {
    const size_t at = RowsOffset(static_cast<size_t>(p_ - out_->data()));
    std::memset(p_, 0, out_->data() + at - p_);
    p_ = out_->data() + at;
    float* rows = reinterpret_cast<float*>(p_);
    p_ += floats * sizeof(float);
    return rows;
  }
  // The size computed by the caller must be exactly what was written.
  void Finish() const { assert(p_ == out_->data() + out_->size()); }

 private:
  std::string* out_;
  char* p_;
};

// Reads fields with a bounds check each; the first failure sticks and later reads do nothing.
class Reader {
 public:
  // Accepts a message of `kind` or of `device_kind` (the same fields, the rows on a device
  // channel: found_device() says which).
  Reader(std::string_view bytes, MoeMessageKind kind, const char* what,
         MoeMessageKind device_kind = MoeMessageKind{0})
      : bytes_(bytes), what_(what) {
    uint8_t version = 0, found = 0;
    if (!Get(&version)) return;
    if (version != kMoeWireVersion) {
      Fail(absl::StrCat("unsupported wire version ", version, " (this build speaks ",
                        kMoeWireVersion, ")"));
      return;
    }
    if (!Get(&found)) return;
    found_device_ = found == static_cast<uint8_t>(device_kind) && found != 0;
    if (found != static_cast<uint8_t>(kind) && !found_device_) {
      Fail(absl::StrCat("message kind is ", found, ", not ", static_cast<int>(kind)));
    }
  }
  bool found_device() const { return found_device_; }

  template <typename T>
  bool Get(T* value) {
    if (!Need(sizeof(T), "a field")) return false;
    *value = LoadLe<T>(bytes_.data() + offset_);
    offset_ += sizeof(T);
    return true;
  }

  bool GetStatus(absl::Status* status) {
    int32_t code = 0;
    uint32_t size = 0;
    if (!Get(&code) || !Get(&size)) return false;
    if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return Fail(absl::StrCat("bad status code ", code));
    }
    if (!Need(size, "the status message")) return false;
    *status = absl::Status(static_cast<absl::StatusCode>(code),
                           absl::string_view(bytes_.data() + offset_, size));
    offset_ += size;
    return true;
  }

  // Reads `count` elements of `element_bytes` each, after checking that the count is
  // non-negative and that they fit in what is left of the message (which also rules out
  // overflow of count x element_bytes). Returns the start of the block.
  const char* GetBlock(int64_t count, size_t element_bytes, const char* name) {
    if (!status_.ok()) return nullptr;
    if (count < 0) {
      Fail(absl::StrCat("negative ", name, " count ", count));
      return nullptr;
    }
    const size_t left = bytes_.size() - offset_;
    if (element_bytes > 0 && static_cast<uint64_t>(count) > left / element_bytes) {
      Fail(absl::StrCat(count, " ", name, " of ", element_bytes, " bytes do not fit in the ", left,
                        " bytes left at offset ", offset_));
      return nullptr;
    }
    const char* start = bytes_.data() + offset_;
    offset_ += static_cast<size_t>(count) * element_bytes;
    return start;
  }

  bool GetTraces(std::vector<TraceContext>* traces) {
    uint32_t count = 0;
    if (!Get(&count)) return false;
    const char* block = GetBlock(count, kTraceBytes, "trace contexts");
    if (block == nullptr) return false;
    traces->resize(count);
    for (TraceContext& t : *traces) {
      std::memcpy(t.trace_id.data(), block, t.trace_id.size());
      std::memcpy(t.span_id.data(), block + 16, t.span_id.size());
      t.flags = static_cast<uint8_t>(block[24]);
      block += kTraceBytes;
    }
    return true;
  }

  // Reads the row block of count x width floats (count and width non-negative, the padding zero,
  // the rows inside the message); *start is where they begin, *floats how many there are.
  bool GetRows(int64_t count, int64_t width, const char** start, size_t* floats) {
    if (!status_.ok()) return false;
    if (count < 0 || width < 0) return Fail(absl::StrCat("bad row shape ", count, " x ", width));
    // width <= INT32_MAX, so count x width overflows int64 only if count is past this bound, and
    // then the rows cannot fit in any message anyway.
    if (width > 0 && count > std::numeric_limits<int64_t>::max() / width) {
      return Fail(absl::StrCat("row shape ", count, " x ", width, " overflows"));
    }
    const size_t pad = RowsOffset(offset_) - offset_;
    if (!Need(pad, "the row padding")) return false;
    for (size_t i = 0; i < pad; ++i) {
      if (bytes_[offset_ + i] != 0) {
        return Fail(absl::StrCat("nonzero padding at offset ", offset_ + i));
      }
    }
    offset_ += pad;
    const int64_t elements = count * width;
    *start = GetBlock(elements, sizeof(float), "floats");
    *floats = static_cast<size_t>(elements);
    return *start != nullptr;
  }

  bool Fail(const std::string& why) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(absl::StrCat(what_, ": ", why));
    return false;
  }
  absl::Status Finish() {
    if (status_.ok() && offset_ != bytes_.size()) {
      Fail(absl::StrCat(bytes_.size() - offset_, " trailing bytes"));
    }
    return status_;
  }

 private:
  bool Need(size_t size, const char* field) {
    if (!status_.ok()) return false;
    if (bytes_.size() - offset_ >= size) return true;
    return Fail(absl::StrCat("truncated message: ", field, " of ", size, " bytes at offset ",
                             offset_, " but the message has ", bytes_.size(), " bytes"));
  }

  std::string_view bytes_;
  const char* what_;
  size_t offset_ = 0;
  absl::Status status_;
  bool found_device_ = false;
};

}  // namespace

absl::StatusOr<MoeMessageKind> PeekMoeMessageKind(std::string_view bytes) {
  if (bytes.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane message of ", bytes.size(), " bytes has no version and kind"));
  }
  const uint8_t version = static_cast<uint8_t>(bytes[0]);
  if (version != kMoeWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported data-plane wire version ", version,
                                                   " (this build speaks ", kMoeWireVersion, ")"));
  }
  const uint8_t kind = static_cast<uint8_t>(bytes[1]);
  if (kind < 1 || kind > 6) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data-plane message kind ", kind));
  }
  return static_cast<MoeMessageKind>(kind);
}

namespace {

// The two requests share a frame: put_fields(w) writes `field_bytes` of fields after the header,
// then come the traces and the rows.
template <typename PutFields>
float* WriteRequest(MoeMessageKind kind, uint64_t step_id, size_t field_bytes,
                    const std::vector<TraceContext>& traces, size_t floats, std::string* out,
                    const PutFields& put_fields) {
  const size_t prefix = kHeaderBytes + field_bytes + TracesBytes(traces);
  Writer w(out, RowsOffset(prefix) + floats * sizeof(float), kind, step_id);
  put_fields(w);
  w.PutTraces(traces);
  float* rows = w.LeaveRows(floats);
  w.Finish();
  return rows;
}

// Each writes every field of m and leaves room for `floats` row floats (no rows for a response
// whose status is not OK: nullptr).
float* Write(const MoeRequest& m, size_t floats, std::string* out) {
  return WriteRequest(MoeMessageKind::kMoeRequest, m.step_id, 4 + 8 + 4, m.traces, floats, out,
                      [&](Writer& w) {
                        w.Put(m.layer);
                        w.Put(m.tokens);
                        w.Put(m.width);
                      });
}

// The two responses share a layout.
float* WriteResponse(MoeMessageKind kind, uint64_t step_id, const absl::Status& status,
                     int64_t count, int32_t width, size_t floats, std::string* out) {
  const size_t prefix = kHeaderBytes + StatusBytes(status) + 8 + 4;
  Writer w(out, status.ok() ? RowsOffset(prefix) + floats * sizeof(float) : prefix, kind,
           step_id);
  w.PutStatus(status);
  w.Put(count);
  w.Put(width);
  float* rows = status.ok() ? w.LeaveRows(floats) : nullptr;
  w.Finish();
  return rows;
}
float* Write(const MoeResponse& m, size_t floats, std::string* out) {
  return WriteResponse(MoeMessageKind::kMoeResponse, m.step_id, m.status, m.tokens, m.width,
                       floats, out);
}
float* Write(const ExpertResponse& m, size_t floats, std::string* out) {
  if (m.rows_on_device) {
    WriteResponse(MoeMessageKind::kDeviceExpertResponse, m.step_id, m.status, m.rows_count,
                  m.width, 0, out);
    return nullptr;
  }
  return WriteResponse(MoeMessageKind::kExpertResponse, m.step_id, m.status, m.rows_count,
                       m.width, floats, out);
}

float* Write(const ExpertRequest& m, size_t floats, std::string* out) {
  const size_t field_bytes = 4 + 8 + 8 + 4 + 8 + m.assignments.size() * kAssignmentBytes;
  const MoeMessageKind kind =
      m.rows_on_device ? MoeMessageKind::kDeviceExpertRequest : MoeMessageKind::kExpertRequest;
  float* rows = WriteRequest(kind, m.step_id, field_bytes, m.traces, m.rows_on_device ? 0 : floats,
                             out, [&](Writer& w) {
                        w.Put(m.layer);
                        w.Put(m.placement_version);
                        w.Put(m.rows_count);
                        w.Put(m.width);
                        w.Put(static_cast<int64_t>(m.assignments.size()));
                        for (const ExpertAssignment& a : m.assignments) {
                          w.Put(a.row);
                          w.Put(a.expert);
                          w.PutFloat(a.weight);
                        }
                      });
  return m.rows_on_device ? nullptr : rows;
}

template <typename M>
std::string EncodeCopying(const M& m) {
  std::string out;
  float* rows = Write(m, m.rows.size(), &out);
  if (rows != nullptr && !m.rows.empty()) {
    std::memcpy(rows, m.rows.data(), m.rows.size() * sizeof(float));
  }
  return out;
}

size_t Floats(int64_t count, int32_t width) {
  return count > 0 && width > 0 ? static_cast<size_t>(count) * static_cast<size_t>(width) : 0;
}

// Each reads every field of m but the rows, and where the rows lie.
absl::Status ReadFields(std::string_view bytes, MoeRequest* m, const char** rows,
                        size_t* floats) {
  Reader r(bytes, MoeMessageKind::kMoeRequest, "MoeRequest");
  if (r.Get(&m->step_id) && r.Get(&m->layer) && r.Get(&m->tokens) && r.Get(&m->width) &&
      r.GetTraces(&m->traces)) {
    r.GetRows(m->tokens, m->width, rows, floats);
  }
  return r.Finish();
}

// The two responses share a layout (WriteResponse).
// With `device_kind`, a message of that kind has no rows (*on_device says so).
absl::Status ReadResponse(std::string_view bytes, MoeMessageKind kind, const char* what,
                          uint64_t* step_id, absl::Status* status, int64_t* count,
                          int32_t* width, const char** rows, size_t* floats,
                          MoeMessageKind device_kind = MoeMessageKind{0},
                          bool* on_device = nullptr) {
  Reader r(bytes, kind, what, device_kind);
  if (on_device != nullptr) *on_device = r.found_device();
  if (r.Get(step_id) && r.GetStatus(status) && r.Get(count) && r.Get(width)) {
    if (r.found_device() && *count < 0) r.Fail(absl::StrCat("bad row count ", *count));
    // A device response's rows follow on the device channel: its message ends with the padding.
    if (status->ok()) r.GetRows(r.found_device() ? 0 : *count, *width, rows, floats);
  }
  return r.Finish();
}
absl::Status ReadFields(std::string_view bytes, MoeResponse* m, const char** rows,
                        size_t* floats) {
  return ReadResponse(bytes, MoeMessageKind::kMoeResponse, "MoeResponse", &m->step_id,
                      &m->status, &m->tokens, &m->width, rows, floats);
}
absl::Status ReadFields(std::string_view bytes, ExpertResponse* m, const char** rows,
                        size_t* floats) {
  return ReadResponse(bytes, MoeMessageKind::kExpertResponse, "ExpertResponse", &m->step_id,
                      &m->status, &m->rows_count, &m->width, rows, floats,
                      MoeMessageKind::kDeviceExpertResponse, &m->rows_on_device);
}

absl::Status ReadFields(std::string_view bytes, ExpertRequest* m, const char** rows,
                        size_t* floats) {
  Reader r(bytes, MoeMessageKind::kExpertRequest, "ExpertRequest",
           MoeMessageKind::kDeviceExpertRequest);
  m->rows_on_device = r.found_device();
  int64_t count = 0;
  if (!(r.Get(&m->step_id) && r.Get(&m->layer) && r.Get(&m->placement_version) &&
        r.Get(&m->rows_count) && r.Get(&m->width) && r.Get(&count))) {
    return r.Finish();
  }
  if (m->rows_count < 0) {
    r.Fail(absl::StrCat("negative rows_count ", m->rows_count));
    return r.Finish();
  }
  const char* block = r.GetBlock(count, kAssignmentBytes, "assignments");
  if (block == nullptr) return r.Finish();
  m->assignments.resize(static_cast<size_t>(count));
  for (ExpertAssignment& a : m->assignments) {
    a.row = LoadLe<int32_t>(block);
    a.expert = LoadLe<int32_t>(block + 4);
    a.weight = std::bit_cast<float>(LoadLe<uint32_t>(block + 8));
    block += kAssignmentBytes;
    if (a.row < 0 || a.row >= m->rows_count) {
      r.Fail(absl::StrCat("assignment row ", a.row, " outside [0, ", m->rows_count, ")"));
      return r.Finish();
    }
  }
  // A device request's rows follow on the device channel: its message ends with the padding.
  if (r.GetTraces(&m->traces)) {
    r.GetRows(m->rows_on_device ? 0 : m->rows_count, m->width, rows, floats);
  }
  return r.Finish();
}

template <typename M>
absl::Status DecodeCopying(std::string_view bytes, M* m) {
  const char* rows = nullptr;
  size_t floats = 0;
  absl::Status status = ReadFields(bytes, m, &rows, &floats);
  m->rows.clear();
  if (status.ok() && rows != nullptr) {
    m->rows.resize(floats);
    if (floats > 0) std::memcpy(m->rows.data(), rows, floats * sizeof(float));
  }
  return status;
}

template <typename M>
absl::Status DecodeViewing(std::string_view bytes, M* m, absl::Span<const float>* rows) {
  const char* start = nullptr;
  size_t floats = 0;
  absl::Status status = ReadFields(bytes, m, &start, &floats);
  m->rows.clear();
  *rows = absl::Span<const float>();
  if (!status.ok() || start == nullptr) return status;
  if (reinterpret_cast<uintptr_t>(start) % alignof(float) != 0) {
    return absl::InvalidArgumentError(
        "data-plane message rows are not float-aligned in memory; decode a copy instead");
  }
  *rows = absl::Span<const float>(reinterpret_cast<const float*>(start), floats);
  return status;
}

}  // namespace

std::string Encode(const MoeRequest& m) { return EncodeCopying(m); }
std::string Encode(const MoeResponse& m) { return EncodeCopying(m); }
std::string Encode(const ExpertRequest& m) { return EncodeCopying(m); }
std::string Encode(const ExpertResponse& m) { return EncodeCopying(m); }

float* EncodeLeavingRows(const MoeRequest& m, std::string* out) {
  return Write(m, Floats(m.tokens, m.width), out);
}
float* EncodeLeavingRows(const MoeResponse& m, std::string* out) {
  return Write(m, Floats(m.tokens, m.width), out);
}
float* EncodeLeavingRows(const ExpertRequest& m, std::string* out) {
  return Write(m, Floats(m.rows_count, m.width), out);
}
float* EncodeLeavingRows(const ExpertResponse& m, std::string* out) {
  return Write(m, Floats(m.rows_count, m.width), out);
}

absl::Status Decode(std::string_view bytes, MoeRequest* m) { return DecodeCopying(bytes, m); }
absl::Status Decode(std::string_view bytes, MoeResponse* m) { return DecodeCopying(bytes, m); }
absl::Status Decode(std::string_view bytes, ExpertRequest* m) { return DecodeCopying(bytes, m); }
absl::Status Decode(std::string_view bytes, ExpertResponse* m) {
  return DecodeCopying(bytes, m);
}

template <typename M>
absl::Status DecodeInPlace(std::string_view bytes, M* m, absl::Span<const float>* rows) {
  return DecodeViewing(bytes, m, rows);
}
template absl::Status DecodeInPlace(std::string_view, MoeRequest*, absl::Span<const float>*);
template absl::Status DecodeInPlace(std::string_view, MoeResponse*, absl::Span<const float>*);
template absl::Status DecodeInPlace(std::string_view, ExpertRequest*, absl::Span<const float>*);
template absl::Status DecodeInPlace(std::string_view, ExpertResponse*, absl::Span<const float>*);

}  // namespace k3
