// PrefixCache: reuse of a conversation's computed prefix across requests (multi-turn agents), kept
// correct for KDA's recurrent state.
//
// An attention KV cache can be cut at any token; a recurrent state cannot: the KDA state S and the
// short-conv caches after n tokens exist only if some sequence stood exactly at n. So the cache
// keeps two kinds of data in a tree keyed by blocks of `block_tokens` tokens (a multiple of
// kKdaChunk, so a restored sequence's chunked KDA runs on the same chunk grid as a cold one):
//   - pages: each node holds the MLA latent rows of its block's tokens for every MLA layer. A page
//     is stored once, whatever the number of conversations that share the block (the tree shares
//     them); a node's page is only meaningful below its ancestors, so only leaves are evicted.
//   - snapshots: a node MAY hold the KDA states (S and the three conv caches of every KDA layer)
//     taken from a sequence whose state had consumed exactly the tokens on the path to it
//     (Insert checks state.length == tokens.size()). A lookup hits only on the deepest matching
//     node that holds such a snapshot; MLA pages alone never make a hit. Issue 24 names peers
//     whose hybrid prefix caches reused a wrong recurrent state (sglang#31474, vllm#50235,
//     vllm#45845); the threads of that class we could read break this invariant: vLLM counted an
//     attention hit while the recurrent group had no state at that length (vllm#43090), published
//     keys for boundaries where no state was materialised (vllm#53084), and SGLang's mamba radix
//     cache stored a state of another position at a node (sglang#33450). Here a snapshot is
//     written only by Insert from a state standing at exactly that boundary, is immutable once
//     stored, and a hit's length is the depth of the node holding the snapshot.
//
// Sharing is copy-on-restore: Restore copies the pages and the snapshot into the sequence's own
// SequenceState (its MlaCache is one contiguous array the MLA kernels read; paging the sequence's
// own cache would change every MLA kernel). The cached data is never written after Insert, so a
// running sequence cannot corrupt it; the copy costs about 1 ms per 8k tokens on k3-tiny, against
// seconds of prefill.
//
// Memory: `budget_bytes` bounds pages + snapshots + keys; past it the least recently used leaves
// are evicted (a node left with neither children nor a snapshot goes with them).
//
// Thread-safety: not thread-safe; the scheduler thread (or the engine's caller) owns it.
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/sequence_state.h"
#include "model/config.h"

namespace k3 {

struct PrefixCacheOptions {
  int64_t block_tokens = 64;          // > 0, a multiple of kKdaChunk
  int64_t budget_bytes = int64_t{1} << 30;  // > 0

  // INVALID_ARGUMENT naming the first option out of range.
  absl::Status Validate() const;
};

// Cumulative counts since the cache was made, and what it holds now.
struct PrefixCacheStats {
  int64_t lookups = 0;         // Restore calls
  int64_t hits = 0;            // Restore calls that restored some tokens
  int64_t lookup_tokens = 0;   // tokens asked for in Restore calls
  int64_t hit_tokens = 0;      // tokens restored
  int64_t inserts = 0;         // snapshots stored
  int64_t evictions = 0;       // nodes evicted for the budget
  int64_t bytes = 0;           // held now
  int64_t nodes = 0;           // blocks held now
  int64_t snapshots = 0;       // snapshots held now
};

class PrefixCache {
 public:
  // REQUIRES: options.Validate() is OK (CHECK-fails otherwise).
  PrefixCache(const ModelConfig& config, const PrefixCacheOptions& options);
  ~PrefixCache();

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int64_t block_tokens() const { return options_.block_tokens; }

  // The longest cached prefix of `tokens` with a snapshot at its end, of at most
  // tokens.size() - 1 tokens (the last token is always computed, for its logits), restored into
  // `state`: MLA rows and KDA states copied, state->length set. Returns the tokens restored; 0 on
  // a miss, with `state` untouched. REQUIRES: `state` is a fresh sequence of this config
  // (length 0).
  int64_t Restore(absl::Span<const int32_t> tokens, SequenceState* state);

  // Stores `state`, which has consumed exactly `tokens`: the MLA rows of the blocks not cached
  // yet, and a snapshot of its KDA states at this boundary (replacing none: an existing snapshot
  // there is kept). Then evicts down to the budget. INVALID_ARGUMENT when tokens.size() is 0 or
  // not a multiple of block_tokens, or state->length (or an MLA cache's length) differs from it.
  absl::Status Insert(absl::Span<const int32_t> tokens, const SequenceState& state);

  // Insert when `state` stands at a block boundary (state->length a positive multiple of
  // block_tokens), else nothing. `consumed`: at least the tokens the state has consumed. Called
  // after every model step of a sequence, so snapshots are taken where the sequence really is.
  absl::Status Record(absl::Span<const int32_t> consumed, const SequenceState& state);

  // Where a prefill from `from` towards `to` should stop first so that the sequence stands at the
  // last block boundary of its prompt (a snapshot a later turn can restore): that boundary when it
  // lies strictly between them, else `to`.
  int64_t PrefillCut(int64_t from, int64_t to) const;

  PrefixCacheStats stats() const { return stats_; }

 private:
  struct Node;

  Node* FindChild(Node* node, absl::Span<const int32_t> block) const;
  // The page of block `block_index` of `state`'s MLA caches.
  std::vector<float> CopyPage(const SequenceState& state, int64_t block_index) const;
  void Touch(Node* node);
  void EvictToBudget();
  void Remove(Node* node);

  const ModelConfig& config_;
  const PrefixCacheOptions options_;
  std::vector<int> mla_layers_, kda_layers_;
  int64_t mla_width_ = 0;
  std::unique_ptr<Node> root_;
  std::list<Node*> lru_;  // most recently used first; every node but the root
  PrefixCacheStats stats_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_H_
