// PrefixAffinity: which attention worker last served a prompt sharing a prefix with this one, so
// that a conversation's next turn goes where its prefix is cached
// (attention_nodes/scheduler/prefix_cache.h).
//
// A prompt is cut into blocks of `block_tokens` tokens; the hash of every block-aligned prefix is
// chained (hash of block i covers blocks 0..i), so one hash names one whole prefix. Record maps
// each of a served prompt's prefix hashes to the worker; Lookup finds the longest prefix of a new
// prompt that has a worker. The map holds at most `capacity` hashes, least recently used dropped
// first. It is a hint: a worker may have evicted the prefix, and the caller still balances load
// (WorkerPool prefers the hinted worker only while it is not much busier than the least loaded).
// A hash collision (64 bits) costs only a less useful hint, never a wrong answer: the worker's own
// cache compares tokens.
//
// Thread-safe.
#ifndef K3SERVE_HTTP_FRONT_PREFIX_AFFINITY_H_
#define K3SERVE_HTTP_FRONT_PREFIX_AFFINITY_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace k3 {

class PrefixAffinity {
 public:
  // REQUIRES: block_tokens > 0, capacity > 0.
  PrefixAffinity(int64_t block_tokens, size_t capacity);

  // The worker recorded for the longest recorded block-aligned prefix of `tokens`, with that
  // prefix's length in tokens; nullopt when none is.
  std::optional<std::pair<int, int64_t>> Lookup(absl::Span<const int32_t> tokens) const;

  // `worker` now serves `tokens`: every block-aligned prefix of it maps to `worker`.
  void Record(absl::Span<const int32_t> tokens, int worker);

  // Drops every hint to `worker` (it was lost or restarted with an empty cache).
  void Forget(int worker);

  size_t size() const;

 private:
  // The chained hashes of `tokens`' whole blocks, shortest prefix first.
  std::vector<uint64_t> PrefixHashes(absl::Span<const int32_t> tokens) const;

  const int64_t block_tokens_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  // Most recently recorded first.
  std::list<std::pair<uint64_t, int>> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::list<std::pair<uint64_t, int>>::iterator> index_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_PREFIX_AFFINITY_H_
