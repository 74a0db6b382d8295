#include "attention_nodes/forward/sequence_state.h"

namespace k3 {

size_t SequenceState::ByteSize() const {
  size_t bytes = 0;
  for (const KdaState& s : kda) bytes += s.ByteSize();
  for (const MlaCache& c : mla) bytes += c.ByteSize();
  return bytes;
}

}  // namespace k3
