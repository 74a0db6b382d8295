#include "tokenizer/streaming_decoder.h"

#include "base/status_macros.h"

namespace k3 {
namespace {

// The length a lead byte announces, or 0 for a byte that cannot start a character.
int SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

// Whether `byte` may follow `lead` as the second byte (RFC 3629's table: no overlong forms, no
// surrogates, nothing past U+10FFFF). Later bytes only need to be continuation bytes.
bool ValidSecond(uint8_t lead, uint8_t byte) {
  if (lead == 0xe0) return byte >= 0xa0 && byte <= 0xbf;
  if (lead == 0xed) return byte >= 0x80 && byte <= 0x9f;
  if (lead == 0xf0) return byte >= 0x90 && byte <= 0xbf;
  if (lead == 0xf4) return byte >= 0x80 && byte <= 0x8f;
  return byte >= 0x80 && byte <= 0xbf;
}

// Moves the complete characters at the front of `bytes` to `out` (invalid subsequences as
// U+FFFD) and leaves in `bytes` only a valid but incomplete final character.
void DrainComplete(std::string& bytes, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i]);
    const int length = SequenceLength(lead);
    if (length == 0) {
      out->append(kReplacementCharacter);
      ++i;
      continue;
    }
    int valid = 1;  // bytes of this character that are valid so far
    while (valid < length && i + valid < bytes.size()) {
      const uint8_t byte = static_cast<uint8_t>(bytes[i + valid]);
      const bool ok = valid == 1 ? ValidSecond(lead, byte) : (byte & 0xc0) == 0x80;
      if (!ok) break;
      ++valid;
    }
    if (valid == length) {
      out->append(bytes, i, length);
    } else if (i + valid == bytes.size()) {
      break;  // valid so far, cut off by the end: wait for more bytes
    } else {
      out->append(kReplacementCharacter);  // a maximal subpart that the next byte breaks
    }
    i += valid;
  }
  bytes.erase(0, i);
}

}  // namespace

absl::StatusOr<std::string> StreamingDecoder::Push(int32_t id) {
  std::string bytes = pending_;
  K3_RETURN_IF_ERROR(tokenizer_.AppendTokenBytes(id, &bytes));
  std::string text;
  DrainComplete(bytes, &text);
  pending_ = std::move(bytes);
  return text;
}

std::string StreamingDecoder::Finish() {
  std::string text = pending_.empty() ? "" : kReplacementCharacter;
  pending_.clear();
  return text;
}

}  // namespace k3
