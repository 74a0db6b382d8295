// Sampler: picks the next token from a row of logits. Temperature 0 is greedy (argmax, ties to the
// lower id). Otherwise: softmax(logits / temperature), restricted to the top_k most likely tokens
// (0 = all), then to the smallest set whose mass reaches top_p (1 = all), sampled with a per-request
// generator seeded from `seed`, so a request with a seed is reproducible whatever it is batched with.
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_SAMPLER_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tokenizer/token_constraint.h"

namespace k3 {

struct SamplingOptions {
  float temperature = 0.f, top_p = 1.f;
  int top_k = 0;
  uint64_t seed = 0;
  // Constrained decoding (response_format, tool_choice): only ids the shape allows are sampled.
  // Both set or both null; shared read-only between the sequences that use them.
  std::shared_ptr<const TokenVocabulary> vocabulary;
  std::shared_ptr<const ConstraintShape> constraint;
  int constraint_max_tokens = 0;  // the constraint's token limit (TokenConstraint); 0: none
};

// InvalidArgument for a negative temperature, top_p outside (0, 1] or a negative top_k.
absl::Status ValidateSamplingOptions(const SamplingOptions& options);

// INTERNAL when a row of logits holds a NaN or an infinity (broken weights or a broken step): no
// token may be sampled from it, since argmax and softmax would return an arbitrary one.
absl::Status CheckLogitsFinite(const float* logits, int64_t vocab);

// The most top_logprobs a request may ask for (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

// A sampled token's log-probability and the `top` most likely tokens' (most likely first, ties to
// the lower id), from the model's own distribution: log_softmax of the raw logits, before
// temperature, top_k and top_p (as OpenAI and vLLM report them), summed in double.
struct TokenLogprobs {
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // (token id, log-probability)
};
// REQUIRES: finite logits, 0 <= token < vocab, 0 <= top.
TokenLogprobs LogprobsOf(const float* logits, int64_t vocab, int32_t token, int top);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // The next id; with a constraint, one it allows (the constraint moves past it). Where the
  // constraint allows nothing (its shape ended) the logits are taken as they are.
  int32_t Next(const float* logits, int64_t vocab);

 private:
  int32_t Pick(const float* logits, int64_t vocab);

  SamplingOptions options_;
  std::optional<TokenConstraint> constraint_;
  std::vector<char> allowed_;
  std::vector<float> masked_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_SAMPLER_H_
