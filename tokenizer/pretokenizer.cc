#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"

namespace k3 {

// X = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] minus Han, Y = [\p{Ll}\p{Lm}\p{Lo}\p{M}] minus Han (spec §2).
// Han is the Script property, as in the release's engine (Rust's regex) and Python's regex:
// PCRE2 10.40+ reads a bare \p{Han} as Script_Extensions, which adds shared CJK punctuation
// ("。", "《") and would glue it to Chinese text; \p{sc:Han} is the Script alone.
#define K3_HAN_ "\\p{sc:Han}"
#define K3_X_ "(?:(?!" K3_HAN_ ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define K3_Y_ "(?:(?!" K3_HAN_ ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define K3_CONTRACTION_ "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
const char kK3Pattern[] =
    "[" K3_HAN_ "]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" K3_X_ "*" K3_Y_ "+" K3_CONTRACTION_
    "|[^\\r\\n\\p{L}\\p{N}]?" K3_X_ "+" K3_Y_ "*" K3_CONTRACTION_
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";
#undef K3_HAN_
#undef K3_X_
#undef K3_Y_
#undef K3_CONTRACTION_

struct Pretokenizer::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string ErrorText(int error) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error, buffer, sizeof(buffer));
  return n < 0 ? absl::StrCat("PCRE2 error ", error)
               : std::string(reinterpret_cast<const char*>(buffer), n);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

absl::StatusOr<Pretokenizer> Pretokenizer::Create(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code->code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("bad split pattern at offset ", offset, ": ",
                                                   ErrorText(error)));
  }
  // Without JIT (an unsupported platform) the interpreter gives the same matches, only slower.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return Pretokenizer(std::move(code));
}

absl::Status Pretokenizer::ForEachPiece(std::string_view text,
                                        const std::function<void(std::string_view)>& piece) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr));
  if (data == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // PCRE2 validates the whole subject's UTF-8 on every call unless told not to; the first call
  // checks it once, the rest skip the check (otherwise splitting would be quadratic).
  uint32_t options = 0;
  size_t start = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, options, data.get(),
                               nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
      return absl::InvalidArgumentError(absl::StrCat(
          "text is not valid UTF-8 at byte ", pcre2_get_startchar(data.get()), ": ",
          ErrorText(rc)));
    }
    if (rc < 0) return absl::InternalError(absl::StrCat("PCRE2 match failed: ", ErrorText(rc)));
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    if (ovector[1] > ovector[0]) {
      piece(text.substr(ovector[0], ovector[1] - ovector[0]));
      start = ovector[1];
    } else {
      // An empty match (possible only with a caller's pattern): step over one character.
      start = ovector[0] + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xc0) == 0x80) ++start;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string_view>> Pretokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  K3_RETURN_IF_ERROR(ForEachPiece(text, [&](std::string_view p) { pieces.push_back(p); }));
  return pieces;
}

}  // namespace k3
