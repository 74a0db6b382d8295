#include "expert_nodes/gpu_expert_compute.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_grouping.h"
#include "kernels/cuda/mxfp4_gpu_layout.h"

namespace k3 {
namespace {

Mxfp4HostMatrix HostView(const WeightMatrix& m) {
  return Mxfp4HostMatrix{static_cast<const uint8_t*>(m.data), m.scales, m.rows, m.cols};
}

absl::Status CheckMatrix(const WeightMatrix& m, int64_t rows, int64_t cols, int64_t expert,
                         const char* name) {
  if (m.type != WeightType::kMxfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert ", expert, " ", name, ": the GPU experts take MXFP4 weights only"));
  }
  if (m.rows != rows || m.cols != cols || !GpuMxfp4ShapeOk(rows, cols)) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", expert, " ", name, " is [", m.rows,
                                                   ", ", m.cols, "]; expected [", rows, ", ", cols,
                                                   "] with both multiples of 64"));
  }
  return absl::OkStatus();
}

bool SameHostBytes(const GatedMlpWeights& a, const GatedMlpWeights& b) {
  auto same = [](const WeightMatrix& x, const WeightMatrix& y) {
    return x.data == y.data && x.scales == y.scales && x.rows == y.rows && x.cols == y.cols;
  };
  return same(a.gate, b.gate) && same(a.up, b.up) && same(a.down, b.down);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuExpertCompute>> GpuExpertCompute::Create(
    const std::vector<GatedMlpWeights>& experts, const GluParams& params, int device) {
  if (absl::Status s = UseCudaDevice(device); !s.ok()) return s;
  std::unique_ptr<GpuExpertCompute> compute(new GpuExpertCompute());
  compute->device_ = device;
  compute->glu_ = GpuGluParams{params.situ ? 1 : 0, params.beta, params.linear_beta};
  cudaStream_t stream;
  K3_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          "cudaStreamCreate");
  compute->stream_ = stream;
  if (absl::Status s = compute->Upload(experts); !s.ok()) return s;
  return compute;
}

GpuExpertCompute::~GpuExpertCompute() {
  cudaSetDevice(device_);
  for (DeviceBuffer* b :
       {&table_, &x_, &h_, &slot_row_, &slot_weight_, &chunks_, &out_, &table_index_device_}) {
    cudaFree(b->data);
  }
  cudaFree(weights_);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status GpuExpertCompute::Upload(const std::vector<GatedMlpWeights>& experts) {
  table_index_.assign(experts.size(), -1);
  int32_t hosted = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    const GatedMlpWeights& w = experts[e];
    if (w.gate.empty()) continue;
    if (hosted == 0) {
      hidden_ = w.gate.rows;
      width_ = w.gate.cols;
    }
    const int64_t id = static_cast<int64_t>(e);
    for (absl::Status s : {CheckMatrix(w.gate, hidden_, width_, id, "gate"),
                           CheckMatrix(w.up, hidden_, width_, id, "up"),
                           CheckMatrix(w.down, width_, hidden_, id, "down")}) {
      if (!s.ok()) return s;
    }
    table_index_[e] = hosted++;
  }
  const int64_t code_bytes = GpuMxfp4CodeBytes(hidden_, width_);
  const int64_t scale_bytes = GpuMxfp4ScaleBytes(hidden_, width_);
  const int64_t expert_bytes = 3 * (code_bytes + scale_bytes);
  weight_bytes_ = expert_bytes * hosted;
  if (hosted == 0) return absl::OkStatus();
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&weights_, weight_bytes_), "cudaMalloc(expert weights)");
  std::vector<uint8_t> packed(expert_bytes);
  std::vector<Mxfp4DeviceExpert> table(hosted);
  const GatedMlpWeights* packed_from = nullptr;  // the host matrices `packed` holds
  for (size_t e = 0; e < experts.size(); ++e) {
    if (table_index_[e] < 0) continue;
    uint8_t* device = static_cast<uint8_t*>(weights_) + table_index_[e] * expert_bytes;
    const WeightMatrix* matrices[3] = {&experts[e].gate, &experts[e].up, &experts[e].down};
    // Experts that view the same host bytes as the last one repacked (benchmarks' synthetic
    // weights) reuse its packed bytes: the repack is a pure function of those bytes.
    const bool repack = packed_from == nullptr || !SameHostBytes(*packed_from, experts[e]);
    packed_from = &experts[e];
    const uint8_t* codes[3];
    const uint8_t* scales[3];
    for (int m = 0; m < 3; ++m) {
      const int64_t offset = m * (code_bytes + scale_bytes);
      if (repack) {
        RepackMxfp4ForGpu(HostView(*matrices[m]), packed.data() + offset,
                          packed.data() + offset + code_bytes);
      }
      codes[m] = device + offset;
      scales[m] = device + offset + code_bytes;
    }
    table[table_index_[e]] =
        Mxfp4DeviceExpert{{codes[0], scales[0]}, {codes[1], scales[1]}, {codes[2], scales[2]}};
    K3_RETURN_IF_CUDA_ERROR(cudaMemcpy(device, packed.data(), expert_bytes, cudaMemcpyHostToDevice),
                            "cudaMemcpy(expert weights)");
  }
  hosts_all_ = hosted == static_cast<int32_t>(experts.size());
  if (absl::Status s = Reserve(table_index_device_, sizeof(int32_t) * table_index_.size());
      !s.ok()) {
    return s;
  }
  K3_RETURN_IF_CUDA_ERROR(cudaMemcpy(table_index_device_.data, table_index_.data(),
                                     sizeof(int32_t) * table_index_.size(), cudaMemcpyHostToDevice),
                          "cudaMemcpy(expert index)");
  if (absl::Status s = Reserve(table_, table.size() * sizeof(table[0])); !s.ok()) return s;
  K3_RETURN_IF_CUDA_ERROR(cudaMemcpy(table_.data, table.data(), table.size() * sizeof(table[0]),
                                     cudaMemcpyHostToDevice),
                          "cudaMemcpy(expert table)");
  return absl::OkStatus();
}

absl::Status GpuExpertCompute::Reserve(DeviceBuffer& buffer, size_t bytes) {
  if (bytes <= buffer.bytes) return absl::OkStatus();
  DeviceAllocationEpoch().fetch_add(1);  // CUDA graphs holding the old address are stale
  if (buffer.data != nullptr) {
    // No queued work on any stream may still use the old memory; cudaFree's own waiting is not
    // a documented guarantee for non-blocking streams.
    K3_RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize before cudaFree");
  }
  K3_RETURN_IF_CUDA_ERROR(cudaFree(buffer.data), "cudaFree");
  buffer = DeviceBuffer{};
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&buffer.data, bytes), "cudaMalloc");
  buffer.bytes = bytes;
  return absl::OkStatus();
}

int32_t GpuExpertCompute::Stage(const float* z, bool z_on_device, int64_t rows,
                                const std::vector<ExpertAssignment>& assignments) {
  // Slots in RunExperts' order: by expert, stable.
  std::vector<int32_t> experts(assignments.size());
  for (size_t i = 0; i < assignments.size(); ++i) experts[i] = assignments[i].expert;
  MoeSlots grouped = GroupSlotsByExpert(experts, table_index_, /*chunk_tokens=*/0);
  const size_t slots = grouped.order.size();
  x_host_.resize(z_on_device ? 0 : slots * width_);
  slot_row_host_.resize(slots);
  slot_weight_host_.resize(slots);
  for (size_t slot = 0; slot < slots; ++slot) {
    const ExpertAssignment& a = assignments[grouped.order[slot]];
    if (!z_on_device) {
      const float* row = z + static_cast<int64_t>(a.row) * width_;
      for (int64_t c = 0; c < width_; ++c) x_host_[slot * width_ + c] = FloatToBf16(row[c]);
    }
    slot_row_host_[slot] = a.row;
    slot_weight_host_[slot] = a.weight;
  }
  // Each row's slots in slot order: the combine's fixed summation order.
  std::vector<int32_t> per_row(static_cast<size_t>(rows), 0);
  for (const ExpertAssignment& a : assignments) ++per_row[a.row];
  row_slots_per_row_ = 0;
  for (int32_t count : per_row) row_slots_per_row_ = std::max(row_slots_per_row_, count);
  row_slots_host_.assign(static_cast<size_t>(rows * row_slots_per_row_), -1);
  std::fill(per_row.begin(), per_row.end(), 0);
  for (size_t slot = 0; slot < slots; ++slot) {
    const int64_t row = slot_row_host_[slot];
    row_slots_host_[row * row_slots_per_row_ + per_row[row]++] = static_cast<int32_t>(slot);
  }
  chunks_host_ = std::move(grouped.chunks);
  return grouped.chunk_tokens;
}

absl::Status GpuExpertCompute::Run(const float* z, int64_t rows, int64_t width,
                                   const std::vector<ExpertAssignment>& assignments, float* out) {
  return RunGrouped(z, /*on_device=*/false, rows, width, assignments, out);
}

absl::Status GpuExpertCompute::RunDeviceRows(const float* z, int64_t rows, int64_t width,
                                             const std::vector<ExpertAssignment>& assignments,
                                             float* out) {
  return RunGrouped(z, /*on_device=*/true, rows, width, assignments, out);
}

absl::Status GpuExpertCompute::CheckAssignments(
    int64_t rows, int64_t width, const std::vector<ExpertAssignment>& assignments) const {
  if (width != width_ && !assignments.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of width ", width, " for experts of width ", width_));
  }
  for (const ExpertAssignment& a : assignments) {
    if (a.row < 0 || a.row >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert assignment row ", a.row, " outside [0, ", rows, ")"));
    }
    if (a.expert < 0 || a.expert >= static_cast<int64_t>(table_index_.size()) ||
        table_index_[a.expert] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", a.expert, " is not hosted by this worker"));
    }
  }
  return absl::OkStatus();
}

MoeMxfp4Launch GpuExpertCompute::StagedLaunch(int32_t chunk_tokens, int64_t rows,
                                              float* out) const {
  MoeMxfp4Launch launch;
  launch.experts = static_cast<const Mxfp4DeviceExpert*>(table_.data);
  launch.chunks = static_cast<const MoeChunk*>(chunks_.data);
  launch.chunk_count = static_cast<int32_t>(chunks_host_.size());
  launch.chunk_tokens = chunk_tokens;
  launch.width = static_cast<int32_t>(width_);
  launch.hidden = static_cast<int32_t>(hidden_);
  launch.x = static_cast<const uint16_t*>(x_.data);
  launch.h = static_cast<uint16_t*>(h_.data);
  launch.slot_weight = static_cast<const float*>(slot_weight_.data);
  launch.slot_out = static_cast<float*>(slot_out_.data);
  launch.row_slots = static_cast<const int32_t*>(row_slots_.data);
  launch.rows = static_cast<int32_t>(rows);
  launch.per_row = row_slots_per_row_;
  launch.out = out;
  launch.glu = glu_;
  return launch;
}

absl::Status GpuExpertCompute::RunGrouped(const float* z, bool on_device, int64_t rows,
                                          int64_t width,
                                          const std::vector<ExpertAssignment>& assignments,
                                          float* out) {
  K3_RETURN_IF_ERROR(CheckAssignments(rows, width, assignments));
  const size_t out_bytes = sizeof(float) * rows * width_;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (assignments.empty()) {
    if (!on_device) {
      std::fill(out, out + rows * width, 0.f);
      return absl::OkStatus();
    }
    K3_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    K3_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out, 0, out_bytes, stream), "cudaMemsetAsync");
    K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "cudaMemsetAsync (at synchronize)");
    return absl::OkStatus();
  }
  const int32_t chunk_tokens = Stage(z, on_device, rows, assignments);
  const size_t slots = assignments.size();
  K3_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  for (absl::Status s :
       {Reserve(x_, sizeof(uint16_t) * slots * width_),
        Reserve(h_, sizeof(uint16_t) * slots * hidden_),
        Reserve(slot_row_, sizeof(int32_t) * slots), Reserve(slot_weight_, sizeof(float) * slots),
        Reserve(slot_out_, sizeof(float) * slots * width_),
        Reserve(row_slots_, sizeof(int32_t) * row_slots_host_.size()),
        Reserve(chunks_, sizeof(MoeChunk) * chunks_host_.size()),
        Reserve(out_, on_device ? 0 : out_bytes)}) {
    if (!s.ok()) return s;
  }
  const struct {
    DeviceBuffer* to;
    const void* from;
    size_t bytes;
  } copies[] = {{&x_, x_host_.data(), sizeof(uint16_t) * x_host_.size()},
                {&slot_row_, slot_row_host_.data(), sizeof(int32_t) * slots},
                {&slot_weight_, slot_weight_host_.data(), sizeof(float) * slots},
                {&row_slots_, row_slots_host_.data(), sizeof(int32_t) * row_slots_host_.size()},
                {&chunks_, chunks_host_.data(), sizeof(MoeChunk) * chunks_host_.size()}};
  for (const auto& copy : copies) {
    if (copy.bytes == 0) continue;  // x when the rows are already on the device
    K3_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(copy.to->data, copy.from, copy.bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync(rows to the GPU)");
  }
  if (on_device) {
    // The slots' rows, gathered and rounded to bf16 where they lie (as Stage does on the host).
    K3_RETURN_IF_CUDA_ERROR(
        static_cast<cudaError_t>(LaunchMoeGatherRows(
            z, static_cast<int32_t>(width_), static_cast<const int32_t*>(slot_row_.data),
            static_cast<int32_t>(slots), static_cast<uint16_t*>(x_.data), stream)),
        "LaunchMoeGatherRows");
  }
  // The combine overwrites every row of the answer (rows without slots with zeros).
  float* answer = on_device ? out : static_cast<float*>(out_.data);
  K3_RETURN_IF_CUDA_ERROR(
      static_cast<cudaError_t>(LaunchMoeMxfp4(StagedLaunch(chunk_tokens, rows, answer), stream)),
      "expert kernels");
  if (!on_device) {
    K3_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(out, out_.data, out_bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(answer from the GPU)");
  }
  K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "expert kernels (at synchronize)");
  return absl::OkStatus();
}

absl::Status GpuExpertCompute::RunOnDevice(const float* z, int64_t rows, int64_t width,
                                           const int32_t* ids, const float* weights, int32_t top_k,
                                           float* out, void* stream) {
  if (width != width_ || rows < 1 || top_k < 1 || rows * top_k > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("RunOnDevice: ", rows, " rows of width ", width,
                                                   ", top ", top_k, ", for experts of width ",
                                                   width_));
  }
  if (!hosts_all_) {
    return absl::InvalidArgumentError("RunOnDevice: this layer does not host every expert");
  }
  const auto slots = static_cast<int32_t>(rows * top_k);
  const auto num_experts = static_cast<int32_t>(table_index_.size());
  // A row picks an expert at most once, so no group is larger than `rows`.
  const int32_t chunk_tokens = MoeChunkTokensFor(rows);
  const int32_t max_chunks =
      MoeGroupMaxChunks(static_cast<int32_t>(rows), top_k, num_experts, chunk_tokens);
  K3_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  for (absl::Status s :
       {Reserve(x_, sizeof(uint16_t) * slots * width_),
        Reserve(h_, sizeof(uint16_t) * slots * hidden_),
        Reserve(slot_row_, sizeof(int32_t) * slots), Reserve(slot_weight_, sizeof(float) * slots),
        Reserve(slot_out_, sizeof(float) * slots * width_),
        Reserve(row_slots_, sizeof(int32_t) * slots),
        Reserve(chunks_, sizeof(MoeChunk) * max_chunks)}) {
    if (!s.ok()) return s;
  }
  MoeGroupArgs group;
  group.ids = ids;
  group.weights = weights;
  group.rows = static_cast<int32_t>(rows);
  group.top_k = top_k;
  group.table_index = static_cast<const int32_t*>(table_index_device_.data);
  group.num_experts = num_experts;
  group.chunk_tokens = chunk_tokens;
  group.max_chunks = max_chunks;
  group.slot_row = static_cast<int32_t*>(slot_row_.data);
  group.slot_weight = static_cast<float*>(slot_weight_.data);
  group.row_slots = static_cast<int32_t*>(row_slots_.data);
  group.chunks = static_cast<MoeChunk*>(chunks_.data);
  K3_RETURN_IF_CUDA_ERROR(static_cast<cudaError_t>(LaunchMoeGroup(group, stream)),
                          "LaunchMoeGroup");
  K3_RETURN_IF_CUDA_ERROR(
      static_cast<cudaError_t>(LaunchMoeGatherRows(z, static_cast<int32_t>(width_), group.slot_row,
                                                   slots, static_cast<uint16_t*>(x_.data), stream)),
      "LaunchMoeGatherRows");
  MoeMxfp4Launch launch;
  launch.experts = static_cast<const Mxfp4DeviceExpert*>(table_.data);
  launch.chunks = group.chunks;
  launch.chunk_count = max_chunks;  // the unused ones are empty
  launch.chunk_tokens = chunk_tokens;
  launch.width = static_cast<int32_t>(width_);
  launch.hidden = static_cast<int32_t>(hidden_);
  launch.x = static_cast<const uint16_t*>(x_.data);
  launch.h = static_cast<uint16_t*>(h_.data);
  launch.slot_weight = group.slot_weight;
  launch.slot_out = static_cast<float*>(slot_out_.data);
  launch.row_slots = group.row_slots;
  launch.rows = static_cast<int32_t>(rows);
  launch.per_row = top_k;
  launch.out = out;  // overwritten by the combine
  launch.glu = glu_;
  K3_RETURN_IF_CUDA_ERROR(static_cast<cudaError_t>(LaunchMoeMxfp4(launch, stream)),
                          "expert kernels");
  return absl::OkStatus();
}

}  // namespace k3
