// OracleGenerate: the plainest generation there is, for tests to check the GenerationScheduler
// (the one generation loop of the product) against a value computed another way: one sequence,
// the whole prompt in one step of LocalEngine's ModelRunner, then one token per step, sampled by
// a Sampler of its own; no batching, no chunked prefill, no prefix cache. It ends as the
// scheduler's contract says (GenerationRequest): after a stop token or, unless ignore_eos, the
// model's eos_token_id (both part of the output), or at max_new_tokens. Test-only.
#ifndef K3SERVE_ENGINE_ORACLE_GENERATION_H_
#define K3SERVE_ENGINE_ORACLE_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "engine/local_engine.h"

namespace k3 {

// The new tokens; `logits` (optional) gets the row each was sampled from.
absl::StatusOr<std::vector<int32_t>> OracleGenerate(LocalEngine& engine,
                                                    const GenerationRequest& request,
                                                    std::vector<std::vector<float>>* logits =
                                                        nullptr);

}  // namespace k3

#endif  // K3SERVE_ENGINE_ORACLE_GENERATION_H_
