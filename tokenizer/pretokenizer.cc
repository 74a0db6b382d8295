#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

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

// PCRE2's JIT gets 32 KiB of stack by default, which a run of a few thousand letters exhausts
// (the letter branches backtrack per character). On that error the match is retried with a
// stack that may grow to kJitStackMax, enough for the longest run the release's cut lets
// through (25,000 characters).
constexpr size_t kJitStackMax = 64 << 20;

struct JitStack {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~JitStack() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
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

namespace {

// The release's encoder (Kimi's tokenization_kimi.py, after Llama 3's) never hands its regex more
// than kWindowChars characters, nor a run of more than kMaxRunChars consecutive whitespace or
// non-whitespace characters (Python's str.isspace): it cuts there first and splits each part
// alone. Ordinary text never reaches the limits; a huge word or whitespace run is cut exactly as
// the release cuts it, and the cut bounds PCRE2's stack use and the BPE work per piece.
constexpr size_t kWindowChars = 400'000;
constexpr size_t kMaxRunChars = 25'000;

// Python's str.isspace() on a code point.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point at text[*i] (advancing *i past it). Bytes of invalid UTF-8 count as one
// non-space character each; PCRE2 reports them afterwards.
uint32_t NextCodePoint(std::string_view text, size_t* i) {
  const uint8_t lead = static_cast<uint8_t>(text[*i]);
  const int length = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  if (length == 1 || *i + length > text.size()) {
    ++*i;
    return lead < 0x80 ? lead : 0xfffd;
  }
  uint32_t c = lead & (0x7f >> length);
  for (int k = 1; k < length; ++k) c = (c << 6) | (static_cast<uint8_t>(text[*i + k]) & 0x3f);
  *i += length;
  return c;
}

// Calls `part` on the parts the release splits separately, in order.
void ForEachReleasePart(std::string_view text,
                        const std::function<void(std::string_view)>& part) {
  size_t part_start = 0, i = 0;
  while (i < text.size()) {  // one window of kWindowChars characters per iteration
    size_t chars = 0, run = 0;
    bool run_is_space = false;
    while (i < text.size() && chars < kWindowChars) {
      const size_t at = i;
      const bool space = IsPythonSpace(NextCodePoint(text, &i));
      if (chars++ == 0 || space != run_is_space) {
        run_is_space = space;
        run = 1;
      } else if (++run > kMaxRunChars) {
        part(text.substr(part_start, at - part_start));
        part_start = at;
        run = 1;
      }
    }
    part(text.substr(part_start, i - part_start));
    part_start = i;
  }
}

}  // namespace

absl::Status Pretokenizer::ForEachPiece(std::string_view text,
                                        const std::function<void(std::string_view)>& piece) const {
  absl::Status status;
  ForEachReleasePart(text, [&](std::string_view part) {
    if (status.ok()) status = MatchPieces(part, part.data() - text.data(), piece);
  });
  return status;
}

absl::Status Pretokenizer::MatchPieces(std::string_view text, size_t offset,
                                       const std::function<void(std::string_view)>& piece) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr));
  if (data == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  JitStack big_stack;  // allocated on the first PCRE2_ERROR_JIT_STACKLIMIT
  // PCRE2 validates the whole subject's UTF-8 on every call unless told not to; the first call
  // checks it once, the rest skip the check (otherwise splitting would be quadratic).
  uint32_t options = 0;
  size_t start = 0;
  while (start < text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, options, data.get(),
                         big_stack.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && big_stack.stack == nullptr) {
      big_stack.context = pcre2_match_context_create(nullptr);
      big_stack.stack = pcre2_jit_stack_create(32 << 10, kJitStackMax, nullptr);
      if (big_stack.context == nullptr || big_stack.stack == nullptr) {
        return absl::ResourceExhaustedError("cannot allocate a PCRE2 JIT stack");
      }
      pcre2_jit_stack_assign(big_stack.context, nullptr, big_stack.stack);
      rc = pcre2_match(code_->code, subject, text.size(), start, options, data.get(),
                       big_stack.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
      return absl::InvalidArgumentError(absl::StrCat(
          "text is not valid UTF-8 at byte ", offset + pcre2_get_startchar(data.get()), ": ",
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
