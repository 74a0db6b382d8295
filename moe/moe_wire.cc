#include "moe/moe_wire.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

class Writer {
 public:
  explicit Writer(MoeMessageKind kind) { Put(static_cast<uint8_t>(kind)); }
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutBytes(const void* data, size_t size) {
    out_.append(static_cast<const char*>(data), size);
  }
  void PutStatus(const absl::Status& status) {
    Put(static_cast<int32_t>(status.code()));
    Put(static_cast<uint32_t>(status.message().size()));
    PutBytes(status.message().data(), status.message().size());
  }
  void PutFloats(const std::vector<float>& values) {
    PutBytes(values.data(), values.size() * sizeof(float));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view bytes, MoeMessageKind kind, const char* what)
      : bytes_(bytes), what_(what) {
    uint8_t found = 0;
    if (!Get(&found) || found != static_cast<uint8_t>(kind)) {
      status_ = absl::InvalidArgumentError(absl::StrCat("not a ", what_, " message"));
    }
  }
  template <typename T>
  bool Get(T* value) {
    if (!status_.ok()) return false;
    if (bytes_.size() - offset_ < sizeof(T)) return Truncated();
    std::memcpy(value, bytes_.data() + offset_, sizeof(T));
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
    if (bytes_.size() - offset_ < size) return Truncated();
    *status = absl::Status(static_cast<absl::StatusCode>(code),
                           absl::string_view(bytes_.data() + offset_, size));
    offset_ += size;
    return true;
  }
  // Reads count x width floats; both must be non-negative and fit the message exactly enough.
  bool GetFloats(int64_t count, int64_t width, std::vector<float>* values) {
    if (!status_.ok()) return false;
    if (count < 0 || width < 0 || (width > 0 && count > std::numeric_limits<int32_t>::max() / width)) {
      return Fail(absl::StrCat("bad row shape ", count, " x ", width));
    }
    const size_t bytes = static_cast<size_t>(count * width) * sizeof(float);
    if (bytes_.size() - offset_ < bytes) return Truncated();
    values->resize(static_cast<size_t>(count * width));
    if (bytes > 0) std::memcpy(values->data(), bytes_.data() + offset_, bytes);  // data() may be null
    offset_ += bytes;
    return true;
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
  bool Truncated() { return Fail("truncated message"); }
  std::string_view bytes_;
  const char* what_;
  size_t offset_ = 0;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<MoeMessageKind> PeekMoeMessageKind(std::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty data-plane message");
  const uint8_t kind = static_cast<uint8_t>(bytes[0]);
  if (kind < 1 || kind > 4) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data-plane message kind ", kind));
  }
  return static_cast<MoeMessageKind>(kind);
}

std::string Encode(const MoeRequest& m) {
  Writer w(MoeMessageKind::kMoeRequest);
  w.Put(m.step_id);
  w.Put(m.layer);
  w.Put(m.tokens);
  w.Put(m.width);
  w.PutFloats(m.rows);
  return w.Take();
}

std::string Encode(const MoeResponse& m) {
  Writer w(MoeMessageKind::kMoeResponse);
  w.Put(m.step_id);
  w.PutStatus(m.status);
  w.Put(m.tokens);
  w.Put(m.width);
  if (m.status.ok()) w.PutFloats(m.rows);
  return w.Take();
}

std::string Encode(const ExpertRequest& m) {
  Writer w(MoeMessageKind::kExpertRequest);
  w.Put(m.step_id);
  w.Put(m.layer);
  w.Put(m.placement_version);
  w.Put(m.rows_count);
  w.Put(m.width);
  w.Put(static_cast<int64_t>(m.assignments.size()));
  w.PutBytes(m.assignments.data(), m.assignments.size() * sizeof(ExpertAssignment));
  w.PutFloats(m.rows);
  return w.Take();
}

std::string Encode(const ExpertResponse& m) {
  Writer w(MoeMessageKind::kExpertResponse);
  w.Put(m.step_id);
  w.PutStatus(m.status);
  w.Put(m.rows_count);
  w.Put(m.width);
  if (m.status.ok()) w.PutFloats(m.rows);
  return w.Take();
}

absl::Status Decode(std::string_view bytes, MoeRequest* m) {
  Reader r(bytes, MoeMessageKind::kMoeRequest, "MoeRequest");
  if (r.Get(&m->step_id) && r.Get(&m->layer) && r.Get(&m->tokens) && r.Get(&m->width)) {
    r.GetFloats(m->tokens, m->width, &m->rows);
  }
  return r.Finish();
}

absl::Status Decode(std::string_view bytes, MoeResponse* m) {
  Reader r(bytes, MoeMessageKind::kMoeResponse, "MoeResponse");
  if (r.Get(&m->step_id) && r.GetStatus(&m->status) && r.Get(&m->tokens) && r.Get(&m->width)) {
    if (m->status.ok()) r.GetFloats(m->tokens, m->width, &m->rows);
  }
  return r.Finish();
}

absl::Status Decode(std::string_view bytes, ExpertRequest* m) {
  Reader r(bytes, MoeMessageKind::kExpertRequest, "ExpertRequest");
  int64_t count = 0;
  if (r.Get(&m->step_id) && r.Get(&m->layer) && r.Get(&m->placement_version) &&
      r.Get(&m->rows_count) && r.Get(&m->width) && r.Get(&count)) {
    std::vector<float> raw;
    // An assignment is three 4-byte fields; read them through the float reader's bound checks.
    static_assert(sizeof(ExpertAssignment) == 3 * sizeof(float));
    if (r.GetFloats(count, 3, &raw)) {
      m->assignments.resize(static_cast<size_t>(count));
      if (!raw.empty()) std::memcpy(m->assignments.data(), raw.data(), raw.size() * sizeof(float));
      r.GetFloats(m->rows_count, m->width, &m->rows);
    }
  }
  return r.Finish();
}

absl::Status Decode(std::string_view bytes, ExpertResponse* m) {
  Reader r(bytes, MoeMessageKind::kExpertResponse, "ExpertResponse");
  if (r.Get(&m->step_id) && r.GetStatus(&m->status) && r.Get(&m->rows_count) && r.Get(&m->width)) {
    if (m->status.ok()) r.GetFloats(m->rows_count, m->width, &m->rows);
  }
  return r.Finish();
}

}  // namespace k3
