// Random checkpoints for tests and benchmarks: config.json plus safetensors holding every tensor of
// spec §2 (K3) or §12.5 (Kimi Linear) for a config, initialized as spec §12.3 prescribes:
//
//   Linear weights N(0, linear_std²); *_res_proj N(0, 0.1²); norms 1 + N(0, 0.1²);
//   A_log = log U(1, 16); dt_bias N(0, 0.5²); e_score_correction_bias N(0, 0.05²);
//   embedding N(0, 1); depthwise conv weights U(-0.5, 0.5).
//
// Matrices and norms are written in `dtype` (BF16 by default; routed experts optionally MXFP4);
// dt_bias, A_log and e_score_correction_bias are always F32, mirroring the release's mixed dtypes.
// K3 configs get the release's "language_model." prefix and A_log [H]; Kimi Linear configs no
// prefix and A_log [1, 1, H, 1], as Kimi-Linear-48B ships them.
//
// Values are a pure function of (seed, tensor name without prefix, element index): sharding, the
// prefix, the dtype and the thread count change only the files, not the numbers (before rounding
// to the dtype). Each block of 65536 elements has its own std::mt19937_64 stream (whose output the
// C++ standard fixes) and the normals come from our own Box-Muller arithmetic, so results depend
// neither on the standard library's distributions nor on libm; blocks are generated in parallel on
// the kernel thread pool. Tensors are generated one at a time while writing, so memory stays near
// the largest tensor. k3-perf (679M parameters, 1.36 GB) takes about 5 s of CPU.
#ifndef K3SERVE_MODEL_RANDOM_CHECKPOINT_H_
#define K3SERVE_MODEL_RANDOM_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace k3 {

enum class TensorInit { kLinear, kResProj, kNorm, kALog, kDtBias, kScoreBias, kEmbedding, kConv };

// One tensor a checkpoint of a config holds.
struct TensorSlot {
  std::string name;  // without the "language_model." prefix
  std::vector<int64_t> shape;
  TensorInit init;
  int layer = -1;   // -1 for global tensors
  int expert = -1;  // routed expert id, -1 otherwise

  int64_t numel() const;
};

// Every tensor of the config's checkpoint, in a fixed order (globals, then layer by layer).
std::vector<TensorSlot> CheckpointLayout(const ModelConfig& config);

// Parameters a decoded token reads: every tensor but the routed experts, plus top-k routed experts
// per MoE layer, minus the embedding table (a token reads one row of it). Spec §12.6: about 190M
// for k3-perf.
int64_t ActiveParameters(const ModelConfig& config);

struct RandomCheckpointOptions {
  int shards = 1;  // > 1: model-0000i-of-0000N.safetensors plus model.safetensors.index.json
  float linear_std = 0.02f;
  // Rows of every router gate.weight for these experts are multiplied by hot_gate_scale, which
  // widens their sigmoid scores so top-k picks them far more often (a skewed expert load).
  std::vector<int> hot_experts;
  float hot_gate_scale = 1.0f;
  DType dtype = DType::kBf16;  // kBf16, kF16 or kF32
  std::optional<bool> language_model_prefix;  // unset: K3 configs yes, Kimi Linear no
  // Routed experts as the release stores them (spec §10): each w1/w2/w3 rounded to MXFP4
  // (model/mxfp4_quantize.h) and written as U8 weight_packed + weight_scale, and config.json gets
  // the release's quantization_config inside text_config. REQUIRES: expert widths divisible by 32.
  bool mxfp4 = false;
  // Write only the safetensors headers, no tensor data: a checkpoint with a model's real shapes and
  // sizes (K3's 1.5 TB in a few MB) for tools that plan from headers (tools/memory_plan.h);
  // Checkpoint::Open rejects it.
  bool headers_only = false;
};

// Writes DIR/config.json and the weights (nothing else: a folder with a tokenizer as well is
// tools/random_model_folder.h's); creates DIR if needed.
absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                   const RandomCheckpointOptions& options);
absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                   int shards = 1);

// The values WriteRandomCheckpoint writes for `slot` (before rounding to the file's dtype).
std::vector<float> RandomTensorValues(const TensorSlot& slot, uint64_t seed,
                                      const RandomCheckpointOptions& options);

// IEEE binary16 with round-to-nearest-even (overflow to infinity), for F16 checkpoints.
uint16_t FloatToHalf(float value);

}  // namespace k3

#endif  // K3SERVE_MODEL_RANDOM_CHECKPOINT_H_
