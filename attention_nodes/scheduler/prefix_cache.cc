#include "attention_nodes/scheduler/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention_nodes/forward/kda.h"
#include "glog/logging.h"

namespace k3 {

absl::Status PrefixCacheOptions::Validate() const {
  if (block_tokens <= 0 || block_tokens % kKdaChunk != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix cache block_tokens must be a positive multiple of ", kKdaChunk,
                     ", got ", block_tokens));
  }
  if (budget_bytes <= 0) {
    return absl::InvalidArgumentError("prefix cache budget_bytes must be > 0");
  }
  return absl::OkStatus();
}

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::vector<int32_t> block;  // this block's tokens (the key under the parent)
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  std::vector<float> page;     // MLA rows: [MLA layer][block_tokens][mla width]
  // KDA states after the path's tokens, per model layer (empty for MLA layers); null: no sequence
  // stood exactly here.
  std::unique_ptr<const std::vector<KdaState>> snapshot;
  int64_t depth = 0;  // blocks from the root
  std::list<Node*>::iterator lru;
  int64_t bytes = 0;
};

PrefixCache::PrefixCache(const ModelConfig& config, const PrefixCacheOptions& options)
    : config_(config), options_(options), root_(std::make_unique<Node>()) {
  const absl::Status valid = options.Validate();
  CHECK(valid.ok()) << valid;
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    (config.IsKda(l) ? kda_layers_ : mla_layers_).push_back(l);
  }
  mla_width_ = config.kv_lora_rank + config.qk_rope_head_dim;
}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::FindChild(Node* node, absl::Span<const int32_t> block) const {
  auto it = node->children.find(std::vector<int32_t>(block.begin(), block.end()));
  return it == node->children.end() ? nullptr : it->second.get();
}

void PrefixCache::Touch(Node* node) { lru_.splice(lru_.begin(), lru_, node->lru); }

int64_t PrefixCache::Restore(absl::Span<const int32_t> tokens, SequenceState* state) {
  const int64_t block = options_.block_tokens;
  ++stats_.lookups;
  stats_.lookup_tokens += static_cast<int64_t>(tokens.size());
  Node* node = root_.get();
  Node* best = nullptr;
  // Blocks that end before the last token: that token is always computed for its logits.
  for (int64_t end = block; end < static_cast<int64_t>(tokens.size()); end += block) {
    node = FindChild(node, tokens.subspan(end - block, block));
    if (node == nullptr) break;
    if (node->snapshot != nullptr) best = node;
  }
  if (best == nullptr) return 0;
  CHECK_EQ(state->length, 0) << "PrefixCache::Restore needs a fresh sequence";
  std::vector<Node*> path;
  for (Node* n = best; n != root_.get(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  const int64_t restored = best->depth * block;
  const size_t page_layer = static_cast<size_t>(block * mla_width_);
  for (size_t m = 0; m < mla_layers_.size(); ++m) {
    MlaCache& cache = state->mla[mla_layers_[m]];
    // Room for the rest of this request's tokens too, so the next steps do not reallocate.
    cache.Reserve(static_cast<int64_t>(tokens.size()) + block);
    for (size_t b = 0; b < path.size(); ++b) {
      std::memcpy(cache.rows.data() + b * page_layer, path[b]->page.data() + m * page_layer,
                  page_layer * sizeof(float));
    }
    cache.length = restored;
  }
  for (int l : kda_layers_) state->kda[l] = (*best->snapshot)[l];
  state->length = restored;
  for (Node* n : path) Touch(n);
  ++stats_.hits;
  stats_.hit_tokens += restored;
  return restored;
}

std::vector<float> PrefixCache::CopyPage(const SequenceState& state, int64_t block_index) const {
  const int64_t block = options_.block_tokens;
  const size_t page_layer = static_cast<size_t>(block * mla_width_);
  std::vector<float> page(mla_layers_.size() * page_layer);
  for (size_t m = 0; m < mla_layers_.size(); ++m) {
    const MlaCache& cache = state.mla[mla_layers_[m]];
    std::memcpy(page.data() + m * page_layer, cache.Row(block_index * block),
                page_layer * sizeof(float));
  }
  return page;
}

absl::Status PrefixCache::Insert(absl::Span<const int32_t> tokens, const SequenceState& state) {
  const int64_t block = options_.block_tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || n % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("prefix cache insert of ", n,
                                                   " tokens: not a multiple of ", block));
  }
  if (state.length != n) {
    return absl::InvalidArgumentError(absl::StrCat("prefix cache insert of ", n,
                                                   " tokens from a state at ", state.length));
  }
  for (int l : mla_layers_) {
    if (state.mla[l].length != n || state.mla[l].width() != mla_width_) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix cache insert: MLA layer ", l, " holds ", state.mla[l].length,
                       " tokens of width ", state.mla[l].width()));
    }
  }
  Node* node = root_.get();
  for (int64_t b = 0; b < n / block; ++b) {
    absl::Span<const int32_t> key = tokens.subspan(b * block, block);
    Node* child = FindChild(node, key);
    if (child == nullptr) {
      auto made = std::make_unique<Node>();
      made->parent = node;
      made->block.assign(key.begin(), key.end());
      made->page = CopyPage(state, b);
      made->depth = b + 1;
      made->bytes = static_cast<int64_t>((made->page.size() + 2 * block) * sizeof(float));
      lru_.push_front(made.get());
      made->lru = lru_.begin();
      stats_.bytes += made->bytes;
      ++stats_.nodes;
      child = made.get();
      node->children.emplace(made->block, std::move(made));
    }
    Touch(child);
    node = child;
  }
  if (node->snapshot == nullptr) {
    auto snapshot = std::make_unique<std::vector<KdaState>>(state.kda.size());
    int64_t bytes = 0;
    for (int l : kda_layers_) {
      (*snapshot)[l] = state.kda[l];
      bytes += static_cast<int64_t>(state.kda[l].ByteSize());
    }
    node->snapshot = std::move(snapshot);
    node->bytes += bytes;
    stats_.bytes += bytes;
    ++stats_.snapshots;
    ++stats_.inserts;
  }
  EvictToBudget();
  return absl::OkStatus();
}

absl::Status PrefixCache::Record(absl::Span<const int32_t> consumed, const SequenceState& state) {
  if (state.length == 0 || state.length % options_.block_tokens != 0) return absl::OkStatus();
  if (static_cast<int64_t>(consumed.size()) < state.length) {
    return absl::InvalidArgumentError(absl::StrCat("prefix cache record: ", consumed.size(),
                                                   " tokens for a state at ", state.length));
  }
  return Insert(consumed.first(state.length), state);
}

int64_t PrefixCache::PrefillCut(int64_t from, int64_t to) const {
  const int64_t boundary = to / options_.block_tokens * options_.block_tokens;
  return boundary > from && boundary < to ? boundary : to;
}

void PrefixCache::EvictToBudget() {
  while (stats_.bytes > options_.budget_bytes) {
    // The least recently used leaf (an inner node's page is needed by the blocks below it).
    auto it = std::find_if(lru_.rbegin(), lru_.rend(),
                           [](const Node* n) { return n->children.empty(); });
    if (it == lru_.rend()) return;
    Node* node = *it;
    ++stats_.evictions;
    Node* parent = node->parent;
    Remove(node);
    // A parent left with neither children nor a state serves no lookup.
    while (parent != root_.get() && parent->children.empty() && parent->snapshot == nullptr) {
      Node* up = parent->parent;
      Remove(parent);
      parent = up;
    }
  }
}

void PrefixCache::Remove(Node* node) {
  lru_.erase(node->lru);
  stats_.bytes -= node->bytes;
  --stats_.nodes;
  if (node->snapshot != nullptr) --stats_.snapshots;
  node->parent->children.erase(node->block);  // destroys the node
}

}  // namespace k3
