// GpuModelRunner: the attention worker's forward pass (ModelRunner, spec §4) on one GPU for BF16
// weights: embedding rows (looked up on the host), per layer Block AttnRes (attn_res.h) or the
// plain residual, RMSNorm, the KDA or MLA mixer (GpuKdaLayer, GpuMlaLayer), the dense MLP or the
// shared experts (GpuGatedMlp), the latent up projection, the final norm and the LM head, all in
// device memory on one stream. The routed experts are reached in one of two ways:
//  - through a RoutedMoe, as ModelRunner reaches them (in process, on the CPU or a GPU, or across
//    the router tier): the normed rows go to the host for Begin, the shared experts run on the GPU
//    meanwhile, and the answer comes back for the up projection;
//  - on the device (a DeviceExpertRunner given): the router's gate product, the gate
//    (kernels/cuda/moe_gate.h), the latent down projection and, after the experts, the latent norm
//    run here on the runner's stream, and the experts take device rows and routing on that stream
//    (GpuExpertCompute::RunOnDevice), so a step touches the host only for the embedded rows going
//    in and the logits coming out. It agrees with ModelRunner within the bf16 rounding of the rows
//    entering its
// products and of the MLA cache (GpuKdaLayer, GpuMlaLayer say how much).
//
// Sequences live in device memory: a KDA state slot (the same slot index in every KDA layer's
// pool) and MLA cache pages (the same page ids in every MLA layer's pool), taken from free lists
// by NewSequence and Step and given back by Release.
//
// CUDA graphs (SetCudaGraphs, device routing only): a decode step (one token per entry) is
// keyed by (batch size, the longest sequence's page count); the first step of a key runs as
// usual, the next is captured into a graph and launched, later ones replay it. Between the
// uploads of the step's inputs (embedded rows, positions, lengths, page tables, slots, all at
// fixed addresses) and the logits' copy back, a step is then one graph launch. A graph is
// dropped and captured again when any GPU layer buffer was reallocated since its capture
// (DeviceAllocationEpoch). With graphs on, MLA decode takes the page count times the page size as
// its longest length (the kernels take each sequence's own length from device memory), so that a
// key's launches do not change as sequences grow within their pages.
//
// Thread-safety: not thread-safe; one owner thread calls everything. The weights and the
// RoutedMoe are borrowed and must outlive the runner.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_GPU_MODEL_RUNNER_H_
#define K3SERVE_ATTENTION_NODES_CUDA_GPU_MODEL_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/cuda/gpu_kda_layer.h"
#include "attention_nodes/cuda/gpu_mla_layer.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gpu_gated_mlp.h"
#include "model/weights.h"
#include "moe/routed_moe.h"

namespace k3 {

// How much device state the runner keeps for sequences.
struct GpuRunnerCapacity {
  int32_t sequences = 8;      // KDA state slots
  int32_t cache_pages = 256;  // MLA cache pages, shared by all sequences
  int32_t page_size = 64;     // tokens per page
};

// A sequence's device state (owned by the runner's pools; the handle by the caller).
struct GpuSequence {
  int32_t slot = -1;
  std::vector<int32_t> pages;
  int64_t length = 0;  // tokens consumed so far
};

struct GpuBatchEntry {
  GpuSequence* sequence = nullptr;
  absl::Span<const int32_t> tokens;  // tokens to append; at least one
  bool all_logits = false;           // logits for every new token, or only for the last
};

// The routed experts of MoE layer `layer` on the runner's device: z [rows, width] fp32, the
// gate's ids and weights [rows, top_k], out [rows, width] fp32 overwritten, all device memory;
// the work is enqueued on `stream` (the runner's cudaStream_t) and not waited for.
using DeviceExpertRunner = std::function<absl::Status(
    int layer, const float* z, int64_t rows, int64_t width, const int32_t* ids,
    const float* weights, int32_t top_k, float* out, void* stream)>;

class GpuModelRunner {
 public:
  // Uploads every non-routed weight (BF16 matrices) to the current device and sizes the pools.
  // With `device_experts`, the routed experts run on the device (the router's BF16 gate and latent
  // projection are uploaded too) and `routed_moe` may be null; without it they go through
  // `routed_moe`. With both (device_experts reaching remote GPUs, RemoteDeviceExperts), a layer
  // whose device_experts call fails is computed again through `routed_moe`, its failure logged. InvalidArgument for other weight types or dims the kernels do not take (the
  // device gate takes at most 1,024 experts and top 32); Internal for CUDA.
  static absl::StatusOr<std::unique_ptr<GpuModelRunner>> Create(
      const ModelWeights* weights, RoutedMoe* routed_moe, const GpuRunnerCapacity& capacity,
      DeviceExpertRunner device_experts = nullptr);
  ~GpuModelRunner();
  GpuModelRunner(const GpuModelRunner&) = delete;
  GpuModelRunner& operator=(const GpuModelRunner&) = delete;

  // A fresh sequence (zeroed state); ResourceExhausted when every slot is taken.
  absl::StatusOr<std::unique_ptr<GpuSequence>> NewSequence();
  // Gives the sequence's slot and pages back.
  void Release(GpuSequence* sequence);

  // ModelRunner::Step's contract: appends each entry's tokens and writes logits rows (per entry in
  // order, every new token's row or only the last) to `logits` [rows, vocab] on the host.
  // InvalidArgument for a token outside the vocabulary or an empty entry; ResourceExhausted when
  // the cache pages run out (nothing is appended then).
  absl::Status Step(absl::Span<const GpuBatchEntry> batch, std::vector<float>* logits);

  const ModelConfig& config() const { return weights_->config; }

  // Turns CUDA graphs for decode steps on or off (see above). InvalidArgument without device
  // routing (a host round trip cannot be captured).
  absl::Status SetCudaGraphs(bool on);
  // Decode steps served by replaying (or launching right after capturing) a graph.
  int64_t graph_launches() const { return graph_launches_; }

 private:
  struct StepGraph {
    void* exec = nullptr;  // cudaGraphExec_t, owned
    uint64_t captured_epoch = ~uint64_t{0};
    uint64_t warmed_epoch = ~uint64_t{0};  // after the last uncaptured run of this key
  };
  struct Layer {
    std::unique_ptr<GpuKdaLayer> kda;
    std::unique_ptr<GpuMlaLayer> mla;
    std::unique_ptr<GpuGatedMlp> mlp;  // the dense MLP or the shared experts
    DeviceBuffer<uint16_t> latent_up;  // [d, h] bf16; empty without LatentMoE
    // The router's share, uploaded for device routing only.
    DeviceBuffer<uint16_t> router_gate, latent_down;  // [E, d], [h, d] bf16
    DeviceBuffer<float> score_bias, latent_norm;      // [E], [h]; empty if the model has none
    DeviceBuffer<float> input_norm, post_norm, attn_res_proj, attn_res_norm, mlp_res_proj,
        mlp_res_norm;
  };

  GpuModelRunner(const ModelWeights* weights, RoutedMoe* routed_moe,
                 DeviceExpertRunner device_experts);
  absl::Status Build(const GpuRunnerCapacity& capacity);
  absl::Status UploadRouter(const MoeWeights& moe, Layer* layer);
  // Pages for every entry's new length, the embedded rows, the MLA and KDA row arrays.
  absl::Status Prepare(absl::Span<const GpuBatchEntry> batch, int64_t rows);
  absl::Status RunLayer(absl::Span<const GpuBatchEntry> batch, int layer);
  absl::Status Mix(absl::Span<const GpuBatchEntry> batch, const Layer& layer);
  absl::Status Ffn(const Layer& layer, int index);
  // The shared experts into ffn_ and the routed experts' rows into routed_ ([rows, width]).
  absl::Status RoutedOnHost(const Layer& layer, int index);
  absl::Status RoutedOnDevice(const Layer& layer, int index);
  // Every layer and the LM head on the stream: what a graph captures.
  absl::Status Forward(absl::Span<const GpuBatchEntry> batch);
  // Forward through the key's graph (running, capturing or replaying, as the header says).
  absl::Status GraphedForward(absl::Span<const GpuBatchEntry> batch);
  absl::Status OutputRows(absl::Span<const GpuBatchEntry> batch);
  // Depth attention over the completed blocks and the current prefix into `out`.
  absl::Status DepthRead(const DeviceBuffer<float>& proj, const DeviceBuffer<float>& norm,
                         float* out);
  absl::Status Norm(const float* x, const DeviceBuffer<float>& gamma, int64_t rows, float* out);
  absl::Status Sync();

  const ModelWeights* const weights_;
  RoutedMoe* const routed_moe_;
  const DeviceExpertRunner device_experts_;
  void* stream_ = nullptr;  // cudaStream_t, owned
  std::unique_ptr<CublasProducts> products_;
  std::vector<Layer> layers_;
  DeviceBuffer<uint16_t> lm_head_;  // [V, d]
  DeviceBuffer<float> final_norm_, output_res_proj_, output_res_norm_;
  int32_t page_size_ = 0;
  std::vector<int32_t> free_slots_, free_pages_;

  // Per-step state (device buffers grow to the largest step).
  int64_t rows_ = 0;
  int32_t max_pages_ = 0;
  std::vector<DeviceBuffer<float>> blocks_;  // completed AttnRes blocks, [rows, d] each
  int32_t block_count_ = 0;
  // Depth reads' source pointers: one slice per read of a step, in pinned host memory (a graph's
  // copy node reads it at replay) and in device memory.
  const float** pinned_sources_ = nullptr;
  int32_t source_slices_ = 0, source_width_ = 0, depth_read_ = 0;
  int64_t logit_rows_ = 0;
  bool cuda_graphs_ = false, graph_lengths_ = false;
  std::map<std::pair<int32_t, int32_t>, StepGraph> graphs_;
  int64_t graph_launches_ = 0;
  DeviceBuffer<float> prefix_, hidden_, normed_, mixed_, ffn_, routed_, selected_, logits_;
  DeviceBuffer<uint16_t> routed16_, selected16_;
  DeviceBuffer<const float*> sources_;
  DeviceBuffer<int32_t> positions_, lengths_, row_tables_, slots_;
  // Device routing: bf16 normed rows, gate logits and scores [rows, E], ids and weights
  // [rows, top_k], latent rows [rows, h].
  DeviceBuffer<uint16_t> normed16_;
  DeviceBuffer<float> gate_logits_, gate_scores_, gate_weights_, latent_;
  DeviceBuffer<int32_t> gate_ids_;
  std::vector<float> host_rows_;  // embedded rows up, normed rows down, routed rows up
  std::vector<float> host_routed_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_GPU_MODEL_RUNNER_H_
