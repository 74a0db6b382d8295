#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/json_value.h"

namespace k3 {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses larger headers; so do we, before mapping anything.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kBf16, "BF16", 2},   {DType::kF16, "F16", 2},         {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},     {DType::kI64, "I64", 8},         {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},     {DType::kI8, "I8", 1},           {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},   {DType::kF8E4M3, "F8_E4M3", 1},  {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kU16, "U16", 2},     {DType::kU32, "U32", 4},         {DType::kU64, "U64", 8},
    {DType::kF8E8M0, "F8_E8M0", 1},
};

const DTypeEntry& Entry(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status TensorError(std::string_view file, const std::string& name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(file), ": tensor '", name, "': ", what));
}

absl::StatusOr<TensorInfo> ParseEntry(const Json& value, const std::string& name,
                                      uint64_t data_size, std::string_view file) {
  if (!value.is_object()) {
    return TensorError(file, name, absl::StrCat("entry must be an object, got ",
                                                json::Describe(value)));
  }
  auto field = [&](const char* key) -> const Json* {
    auto it = value.find(key);
    return it == value.end() ? nullptr : &*it;
  };
  TensorInfo info;
  const Json* dtype = field("dtype");
  if (dtype == nullptr || !dtype->is_string()) {
    return TensorError(file, name, "missing or non-string \"dtype\"");
  }
  auto parsed = ParseDType(dtype->get_ref<const std::string&>());
  if (!parsed.ok()) return TensorError(file, name, parsed.status().message());
  info.dtype = *parsed;

  const Json* shape = field("shape");
  if (shape == nullptr || !shape->is_array()) {
    return TensorError(file, name, "missing or non-list \"shape\"");
  }
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& dim : *shape) {
    auto d = json::ToInt(dim, "shape entry", 0, INT64_MAX);
    if (!d.ok()) return TensorError(file, name, d.status().message());
    info.shape.push_back(*d);
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(*d), &numel);
  }
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(info.dtype)), &bytes);
  if (overflow) {
    return TensorError(file, name,
                       absl::StrCat("shape ", ShapeString(info.shape), " overflows 64 bits"));
  }

  const Json* offsets = field("data_offsets");
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2) {
    return TensorError(file, name, "missing \"data_offsets\" or not a list of two integers");
  }
  auto begin = json::ToInt((*offsets)[0], "data_offsets[0]", 0, INT64_MAX);
  if (!begin.ok()) return TensorError(file, name, begin.status().message());
  auto end = json::ToInt((*offsets)[1], "data_offsets[1]", 0, INT64_MAX);
  if (!end.ok()) return TensorError(file, name, end.status().message());
  info.begin = static_cast<uint64_t>(*begin);
  info.end = static_cast<uint64_t>(*end);
  if (info.begin > info.end || info.end > data_size) {
    return TensorError(file, name,
                       absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                    "] do not lie within the data section of ", data_size,
                                    " bytes"));
  }
  if (info.end - info.begin != bytes) {
    return TensorError(file, name,
                       absl::StrCat("data_offsets span ", info.end - info.begin, " bytes but ",
                                    DTypeName(info.dtype).data(), " ", ShapeString(info.shape),
                                    " needs ", bytes));
  }
  return info;
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::Status(errno == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInternal,
                      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  std::string shown(name.substr(0, 32));
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", shown, "\""));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensorsHeader(std::string_view json,
                                                                         uint64_t data_size,
                                                                         std::string_view file) {
  auto root = json::ParseObject(json);
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(file), ": bad safetensors header: ", root.status().message()));
  }
  std::map<std::string, TensorInfo> tensors;
  // nlohmann objects iterate in key order, so the first error reported is always the same.
  for (const auto& [name, value] : root->items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Sv(file), ": __metadata__ must be an object of strings"));
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(Sv(file), ": __metadata__ entry '", key,
                                                         "' must be a string, got ",
                                                         json::Describe(item)));
        }
      }
      continue;
    }
    K3_ASSIGN_OR_RETURN(auto info, ParseEntry(value, name, data_size, file));
    tensors.emplace(name, std::move(info));
  }
  // No two non-empty tensors may share bytes.
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : tensors) {
    if (info.end > info.begin) order.emplace_back(&name, &info);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->begin < b.second->begin;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i].second->begin < order[i - 1].second->end) {
      return TensorError(file, *order[i].first,
                         absl::StrCat("data_offsets [", order[i].second->begin, ", ",
                                      order[i].second->end, "] overlap tensor '",
                                      *order[i - 1].first, "' [", order[i - 1].second->begin,
                                      ", ", order[i - 1].second->end, "]"));
    }
  }
  return tensors;
}

absl::StatusOr<std::map<std::string, TensorInfo>> ReadSafetensorsHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("cannot open", path);
  uint8_t length_bytes[8];
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too short for a safetensors file"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | length_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " is over the limit of ", kMaxHeaderBytes));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the file ends inside its header of ", header_len, " bytes"));
  }
  return ParseSafetensorsHeader(header, std::numeric_limits<uint64_t>::max(), path);
}

namespace {

// Written files at least this large are dropped from the page cache once on disk.
constexpr uint64_t kDropCacheBytes = uint64_t{64} << 20;

// Maps `size` bytes of `fd` read-only at an address that is a multiple of 2 MiB and asks for huge
// pages. Decode streams every weight once per token; with 4 KiB pages each page boundary costs a
// TLB walk and stops the hardware prefetchers, and the page cache then hands out 2 MiB folios
// (mapped whole) wherever the kernel supports them for this file system. Falls back to a plain
// mapping. Returns MAP_FAILED (errno set) only if that fails too.
void* MapForStreaming(int fd, uint64_t size) {
  constexpr uint64_t kHugePage = uint64_t{2} << 20;
  void* reserved = ::mmap(nullptr, size + kHugePage, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved != MAP_FAILED) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(reserved);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    void* map = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED,
                       fd, 0);
    if (map != MAP_FAILED) {
      // Give back the reservation around the mapping.
      if (aligned > start) ::munmap(reserved, aligned - start);
      const uintptr_t end = aligned + size, reserved_end = start + size + kHugePage;
      const uintptr_t tail = (end + 4095) / 4096 * 4096;
      if (reserved_end > tail) ::munmap(reinterpret_cast<void*>(tail), reserved_end - tail);
      ::madvise(map, size, MADV_HUGEPAGE);  // advice only: an error changes nothing
      return map;
    }
    ::munmap(reserved, size + kHugePage);
  }
  return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t length_bytes[8];
  if (size < 8 || ::pread(fd, length_bytes, 8, 0) != 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes is too short for a safetensors file"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | length_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " does not fit the file of ", size,
                     " bytes (limit ", kMaxHeaderBytes, ")"));
  }
  void* map = MapForStreaming(fd, size);
  ::close(fd);
  if (map == MAP_FAILED) return ErrnoError("cannot map", path);

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  const auto* base = static_cast<const uint8_t*>(map);
  std::string_view header(reinterpret_cast<const char*>(base + 8), header_len);
  K3_ASSIGN_OR_RETURN(auto tensors, ParseSafetensorsHeader(header, size - 8 - header_len, path));
  file->tensors_ = std::move(tensors);
  file->data_ = base + 8 + header_len;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", Sv(name), "'"));
  }
  TensorView view;
  view.name = it->first;
  view.dtype = it->second.dtype;
  view.shape = it->second.shape;
  view.data = data_ + it->second.begin;
  view.bytes = it->second.end - it->second.begin;
  view.file = path_;
  return view;
}

namespace {

// The header WriteSafetensorsStreaming writes (the JSON, padded with spaces to a multiple of 8
// bytes), and each tensor's data size in `sizes`; an error for a reserved or repeated name or a
// bad shape.
absl::StatusOr<std::string> SafetensorsHeader(const std::string& path,
                                              const std::vector<TensorSpec>& specs,
                                              const std::map<std::string, std::string>& metadata,
                                              std::vector<uint64_t>* sizes) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ",";
      first = false;
      json::AppendQuoted(key, &header);
      header += ":";
      json::AppendQuoted(value, &header);
    }
    header += "}";
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    if (spec.name == "__metadata__" || !names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", spec.name, "' is reserved or repeated"));
    }
    uint64_t bytes = DTypeSize(spec.dtype);
    for (int64_t d : spec.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", spec.name,
                                                       "' has a bad shape ",
                                                       ShapeString(spec.shape)));
      }
    }
    if (header.size() > 1) header += ",";
    json::AppendQuoted(spec.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", DTypeName(spec.dtype).data(), "\",\"shape\":",
                    ShapeString(spec.shape), ",\"data_offsets\":[", offset, ",", offset + bytes,
                    "]}");
    offset += bytes;
    sizes->push_back(bytes);
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

}  // namespace

absl::Status WriteSafetensorsStreaming(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::function<absl::Status(size_t index, std::string* bytes)>& produce,
    const std::map<std::string, std::string>& metadata) {
  std::vector<uint64_t> sizes;
  K3_ASSIGN_OR_RETURN(std::string made, SafetensorsHeader(path, specs, metadata, &sizes));
  const std::string& header = made;
  uint64_t data_bytes = 0;
  for (uint64_t bytes : sizes) data_bytes += bytes;

  const std::string tmp = path + ".tmp";
  FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) return ErrnoError("cannot create", tmp);
  auto fail = [&](absl::Status status) {
    std::fclose(out);
    std::remove(tmp.c_str());
    return status;
  };
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  if (std::fwrite(length, 1, 8, out) != 8 ||
      std::fwrite(header.data(), 1, header.size(), out) != header.size()) {
    return fail(ErrnoError("cannot write", tmp));
  }
  std::string bytes;
  for (size_t i = 0; produce && i < specs.size(); ++i) {
    bytes.clear();
    if (absl::Status s = produce(i, &bytes); !s.ok()) return fail(s);
    if (bytes.size() != sizes[i]) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", specs[i].name, "' has ", bytes.size(),
                       " bytes of data, its dtype and shape need ", sizes[i])));
    }
    if (std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size()) {
      return fail(ErrnoError("cannot write", tmp));
    }
  }
  if (data_bytes >= kDropCacheBytes && std::fflush(out) == 0 && ::fdatasync(::fileno(out)) == 0) {
    // Leaves the page cache, so that the first reader maps the file in huge pages
    // (MapForStreaming) instead of the 4 KiB pages this writer left there. Advice only.
    ::posix_fadvise(::fileno(out), 0, 0, POSIX_FADV_DONTNEED);
  }
  if (std::fclose(out) != 0) {
    std::remove(tmp.c_str());
    return ErrnoError("cannot write", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError("cannot rename to", path);
    std::remove(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return WriteSafetensorsStreaming(
      path, specs,
      [&](size_t i, std::string* bytes) {
        *bytes = tensors[i].bytes;
        return absl::OkStatus();
      },
      metadata);
}

}  // namespace k3
