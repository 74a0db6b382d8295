// gpu_step_bench: the whole k3-slice model (spec §12.7: K3's real widths, 4 layers, 64 MXFP4
// routed experts, top-16) on one GPU, wired as GpuEngine wires it (GpuModelRunner for everything
// but the routed experts; GpuExpertCompute, one per MoE layer, shared by two runners: one routing
// on the host through a LocalRoutedMoe, one on the device, GpuEngine's default), against what the
// same device can do in the same run:
//  - copy: a device-to-device cudaMemcpy of 2 GiB, bytes read plus written per second;
//  - peak: a bf16 x bf16 cuBLAS product of 8192^3 (fp32 out), FLOP per second;
//  - decode at batch 1, 8, 32 each way of routing, and with device routing as CUDA graphs
//    ("dev+graph": per batch size one plain step, one captured, then replays), sequences with 32
//    prefilled tokens and one new token each per step: the step's median time and range over
//    interleaved rounds, the bandwidth floor (the bytes the step must move, bench/step_bytes.h,
//    with the distinct experts the host routing touched counted in the run, over the copy rate),
//    the ratio step/floor and the batch-32/batch-1 ratio;
//  - prefill: one 2048-token prompt each way (the better of two runs), tokens per second and its
//    FLOP rate (2 x active parameters per token; attention's own products left out) as a
//    fraction of the peak.
// It ends with a verdict against issue 21's targets (batch-1 step <= 1.5x its floor, batch 32 <=
// 3x batch 1); a miss does not change the exit status, which is 1 only on an error.
//
// Weights: bench/synthetic_weights.h (random, built in memory in seconds; a random checkpoint of
// 10 GB would take minutes to draw and write). Every matrix still has its real shape and dtype
// and its own device copy, so the step reads the same bytes as with a real checkpoint; the host
// side repeats values (which only the host sees) and gives a layer's experts the same numbers.
// Times are host wall clock around GpuModelRunner::Step, which ends with the logits on the host.
//
//   bazel-bin/bench/gpu_step_bench [rounds]     (on a GPU machine: tools/gpu_check.sh runs it)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "attention_nodes/cuda/gpu_model_runner.h"
#include "bench/gpu_timing.h"
#include "bench/step_bytes.h"
#include "bench/synthetic_weights.h"
#include "engine/local_routed_moe.h"
#include "expert_nodes/gpu_expert_compute.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/device_buffer.h"
#include "model/config.h"
#include "model/glu_params.h"
#include "model/random_checkpoint.h"

namespace k3 {
namespace {

constexpr int kPrefilled = 32;  // context tokens of each decode sequence before the first step
constexpr int kStepsPerRound = 3;
constexpr int kPrefillTokens = 2048;
constexpr int kBatches[] = {1, 8, 32};

// Exits with status 1 and the status's message when it is an error.
void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    exit(1);
  }
}

template <typename T>
T CheckOk(absl::StatusOr<T> value, const char* what) {
  CheckOk(value.status(), what);
  return *std::move(value);
}

double Seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The model on the GPU, wired both ways GpuEngine::Open wires MXFP4 experts (routed on the host
// through a LocalRoutedMoe, and on the device), sharing the experts, plus a count of the distinct
// experts each host-routed MoE call touches. Members are destroyed in reverse order: the runners
// before the routed experts they call.
struct Model {
  std::vector<std::unique_ptr<GpuExpertCompute>> experts;  // per layer; null where not MoE
  std::unique_ptr<LocalRoutedMoe> moe;
  std::unique_ptr<GpuModelRunner> host_routed, device_routed;
  double touched = 0;  // distinct (layer, expert) pairs since the last reset
};

void Wire(const ModelWeights& weights, int capacity_sequences, int pages, Model* model) {
  const GluParams glu = GluParamsFor(weights.config);
  model->experts.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    if (!weights.layers[l].is_moe) continue;
    model->experts[l] = CheckOk(GpuExpertCompute::Create(weights.layers[l].moe.experts, glu, 0),
                                "GpuExpertCompute::Create");
  }
  const int num_experts = weights.config.num_experts;
  ExpertRunner on_gpu = [model, num_experts](int layer, const float* z, int64_t rows, int64_t width,
                                             const std::vector<ExpertAssignment>& assignments,
                                             float* out) {
    std::vector<bool> seen(num_experts, false);
    for (const ExpertAssignment& a : assignments) {
      if (!seen[a.expert]) model->touched += 1;
      seen[a.expert] = true;
    }
    return model->experts[layer]->Run(z, rows, width, assignments, out);
  };
  model->moe = std::make_unique<LocalRoutedMoe>(&weights, std::move(on_gpu));
  GpuRunnerCapacity capacity;
  capacity.sequences = capacity_sequences;
  capacity.cache_pages = pages;
  capacity.page_size = 64;
  model->host_routed = CheckOk(GpuModelRunner::Create(&weights, model->moe.get(), capacity),
                               "GpuModelRunner::Create");
  DeviceExpertRunner on_device = [model](int layer, const float* z, int64_t rows, int64_t width,
                                         const int32_t* ids, const float* weights, int32_t top_k,
                                         float* out, void* stream) {
    return model->experts[layer]->RunOnDevice(z, rows, width, ids, weights, top_k, out, stream);
  };
  model->device_routed =
      CheckOk(GpuModelRunner::Create(&weights, nullptr, capacity, std::move(on_device)),
              "GpuModelRunner::Create (device routing)");
}

// Device-to-device copy rate, bytes read plus written per second.
double CopyRate(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 31;
  DeviceBuffer<uint8_t> from, to;
  CheckOk(from.Reserve(bytes), "copy buffer");
  CheckOk(to.Reserve(bytes), "copy buffer");
  CHECK_CUDA(cudaMemsetAsync(from.get(), 1, bytes, stream));
  auto copy = [&] {
    CHECK_CUDA(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  };
  TimeOnStream(copy, 2, stream);
  std::vector<double> seconds;
  for (int round = 0; round < 5; ++round) seconds.push_back(TimeOnStream(copy, 5, stream));
  return 2.0 * bytes / Median(seconds);
}

// bf16 tensor-core rate of cuBLAS on an 8192^3 product (operands from `values`, random bf16).
double Bf16Peak(const uint16_t* values, cudaStream_t stream) {
  constexpr int64_t n = 8192;
  DeviceBuffer<uint16_t> w, x;
  DeviceBuffer<float> y;
  CheckOk(w.Reserve(n * n), "gemm buffer");
  CheckOk(x.Reserve(n * n), "gemm buffer");
  CheckOk(y.Reserve(n * n), "gemm buffer");
  CHECK_CUDA(cudaMemcpy(w.get(), values, n * n * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(x.get(), values + 4099, n * n * 2, cudaMemcpyHostToDevice));
  auto products = CheckOk(CublasProducts::Create(stream), "CublasProducts::Create");
  auto gemm = [&] {
    CheckOk(products->Linear(w.get(), n, n, x.get(), n, y.get(), false), "cuBLAS product");
  };
  TimeOnStream(gemm, 2, stream);
  std::vector<double> seconds;
  for (int round = 0; round < 5; ++round) seconds.push_back(TimeOnStream(gemm, 5, stream));
  return 2.0 * n * n * n / Median(seconds);
}

struct DecodeCase {
  const char* routing = "";
  GpuModelRunner* runner = nullptr;
  bool graphs = false;  // decode steps as CUDA graphs (device routing only)
  int batch = 0;
  std::vector<std::unique_ptr<GpuSequence>> sequences;
  std::vector<double> round_seconds;  // mean step time of each round
  double touched = 0, context = 0;    // summed over timed steps
  int steps = 0, next_token = 1;
};

// One decode step of every sequence of `c`; returns its seconds.
double DecodeStep(Model& model, DecodeCase& c, int vocab) {
  std::vector<int32_t> tokens(c.batch);
  std::vector<GpuBatchEntry> entries(c.batch);
  for (int b = 0; b < c.batch; ++b) {
    tokens[b] = (c.next_token++ * 7919 + b * 131) % vocab;
    entries[b] = GpuBatchEntry{c.sequences[b].get(), absl::MakeConstSpan(&tokens[b], 1), false};
  }
  std::vector<float> logits;
  return Seconds([&] { CheckOk(c.runner->Step(entries, &logits), "decode step"); });
}

void StartCase(Model& model, DecodeCase& c, int vocab) {
  CheckOk(c.runner->SetCudaGraphs(c.graphs), "SetCudaGraphs");
  std::vector<std::vector<int32_t>> prompts(c.batch);
  std::vector<GpuBatchEntry> entries;
  for (int b = 0; b < c.batch; ++b) {
    c.sequences.push_back(CheckOk(c.runner->NewSequence(), "NewSequence"));
    for (int t = 0; t < kPrefilled; ++t) prompts[b].push_back((b * 977 + t * 31 + 5) % vocab);
    entries.push_back(GpuBatchEntry{c.sequences[b].get(), prompts[b], false});
  }
  std::vector<float> logits;
  CheckOk(c.runner->Step(entries, &logits), "prefill of the decode sequences");
  for (int warm = 0; warm < 2; ++warm) DecodeStep(model, c, vocab);
}

void TimeRound(Model& model, DecodeCase& c, int vocab) {
  CheckOk(c.runner->SetCudaGraphs(c.graphs), "SetCudaGraphs");
  double seconds = 0;
  for (int s = 0; s < kStepsPerRound; ++s) {
    model.touched = 0;
    seconds += DecodeStep(model, c, vocab);
    c.touched += model.touched;
    c.context += static_cast<double>(c.sequences[0]->length);
    ++c.steps;
  }
  c.round_seconds.push_back(seconds / kStepsPerRound);
}

// Seconds of one kPrefillTokens prompt (a fresh sequence each time), the better of two after a
// warm-up (the router's host products at 2048 rows take a while; more runs would not fit 90 s).
double PrefillSeconds(GpuModelRunner& runner, int vocab) {
  std::vector<int32_t> prompt(kPrefillTokens);
  for (int t = 0; t < kPrefillTokens; ++t) prompt[t] = (t * 7919 + 11) % vocab;
  std::vector<double> seconds;
  for (int run = 0; run < 3; ++run) {
    auto sequence = CheckOk(runner.NewSequence(), "NewSequence");
    const GpuBatchEntry entry{sequence.get(), prompt, false};
    std::vector<float> logits;
    const double s = Seconds([&] { CheckOk(runner.Step({entry}, &logits), "prefill step"); });
    if (run > 0) seconds.push_back(s);  // the first one warms up
    runner.Release(sequence.get());
  }
  return *std::min_element(seconds.begin(), seconds.end());
}

// The decode table and the verdict; device-routed rows use the host-routed rows' expert counts
// (the same routing up to the bf16 rounding of the gate's input).
void Report(const ModelConfig& config, const std::vector<DecodeCase>& cases, double copy_rate) {
  printf("%-9s %6s %10s %18s %8s %9s %9s %10s %8s\n", "routing", "batch", "ms/step", "ms range",
         "experts", "GB/step", "floor ms", "step/floor", "x b1");
  std::string verdict;
  const size_t per_routing = std::size(kBatches);
  for (size_t i = 0; i < cases.size(); ++i) {
    const DecodeCase& c = cases[i];
    const DecodeCase& counted = cases[i % per_routing];    // the host-routed case
    const DecodeCase& first = cases[i - i % per_routing];  // this routing's batch 1
    const double step = Median(c.round_seconds), step_b1 = Median(first.round_seconds);
    const auto [lo, hi] = std::minmax_element(c.round_seconds.begin(), c.round_seconds.end());
    const double touched = counted.touched / counted.steps;
    const DecodeStepBytes bytes = DecodeStepBytesFor(config, c.batch, c.context / c.steps, touched);
    const double floor = bytes.total() / copy_rate;
    printf("%-9s %6d %10.2f %8.2f-%-9.2f %8.1f %9.2f %9.2f %10.2f %8.2f\n", c.routing, c.batch,
           step * 1e3, *lo * 1e3, *hi * 1e3, touched, bytes.total() / 1e9, floor * 1e3,
           step / floor, step / step_b1);
    char line[200];
    if (c.batch == 1) {
      snprintf(line, sizeof(line), "%s routing: batch-1 step %.2fx its floor (target <= 1.5: %s)",
               c.routing, step / floor, step / floor <= 1.5 ? "met" : "MISSED");
      verdict += line;
    }
    if (c.batch == 32) {
      snprintf(line, sizeof(line), ", batch 32 %.2fx batch 1 (target <= 3: %s); ", step / step_b1,
               step / step_b1 <= 3 ? "met" : "MISSED");
      verdict += line;
    }
  }
  printf("verdict: %s\n", verdict.c_str());
}

int Main(int rounds) {
  if (NoGpu()) return 0;
  PrintDevice();
  const ModelConfig config = CheckOk(NamedConfig("k3-slice"), "k3-slice");
  SyntheticModel synthetic;
  const double build = Seconds([&] { synthetic = MakeSyntheticWeights(config, 1); });
  Model model;
  int sequences = 1;
  for (int batch : kBatches) sequences += batch;
  const double upload = Seconds([&] { Wire(*synthetic.weights, sequences, 512, &model); });
  printf("k3-slice: weights built in %.1f s, uploaded (two runners) in %.1f s\n", build, upload);

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int vocab = config.vocab_size;
  std::vector<DecodeCase> cases;
  const struct {
    const char* name;
    GpuModelRunner* runner;
    bool graphs;
  } routings[] = {{"host", model.host_routed.get(), false},
                  {"device", model.device_routed.get(), false},
                  {"dev+graph", model.device_routed.get(), true}};
  for (const auto& routing : routings) {
    for (int batch : kBatches) {
      cases.emplace_back();
      cases.back().routing = routing.name;
      cases.back().runner = routing.runner;
      cases.back().graphs = routing.graphs;
      cases.back().batch = batch;
    }
  }
  for (DecodeCase& c : cases) StartCase(model, c, vocab);
  for (int round = 0; round < rounds; ++round) {
    for (DecodeCase& c : cases) TimeRound(model, c, vocab);
  }
  const double copy_rate = CopyRate(stream);
  const double peak = Bf16Peak(synthetic.linear_pool.data(), stream);
  const double prefill_host = PrefillSeconds(*model.host_routed, vocab);
  CheckOk(model.device_routed->SetCudaGraphs(false), "SetCudaGraphs");
  const double prefill_device = PrefillSeconds(*model.device_routed, vocab);
  CHECK_CUDA(cudaStreamDestroy(stream));

  printf("copy: %.0f GB/s (read + write); bf16 peak (cuBLAS 8192^3): %.0f TFLOP/s\n",
         copy_rate / 1e9, peak / 1e12);
  printf("\nk3-slice decode step (%d prefilled tokens per sequence; %d rounds of %d steps)\n",
         kPrefilled, rounds, kStepsPerRound);
  Report(config, cases, copy_rate);
  printf(
      "dev+graph: %lld steps launched as CUDA graphs (the timed steps and one capture per batch "
      "size, if capture worked)\n",
      static_cast<long long>(model.device_routed->graph_launches()));
  const double flops = 2.0 * static_cast<double>(ActiveParameters(config)) * kPrefillTokens;
  for (const auto& [routing, seconds] :
       {std::pair{"host", prefill_host}, std::pair{"device", prefill_device}}) {
    printf(
        "prefill (%s routing): %d tokens in %.1f ms, %.0f tokens/s, %.1f TFLOP/s = %.3f of "
        "the bf16 peak\n",
        routing, kPrefillTokens, seconds * 1e3, kPrefillTokens / seconds, flops / seconds / 1e12,
        flops / seconds / peak);
  }
  return 0;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) { return k3::Main(argc > 1 ? std::max(3, atoi(argv[1])) : 5); }
