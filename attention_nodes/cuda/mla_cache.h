// Writing new rows into MLA's paged latent cache on a GPU (the GPU twin of mla.cc's
// AppendToCaches): each new token's cache row [c | k_pe] (kv_a_proj's output after
// kv_a_layernorm on its c part: rms_norm.h with the row stride does that in place) is rounded to
// bf16 and stored where mla_decode.h reads it: token n of sequence b is row n % page_size of page
// block_table[b, n / page_size].
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_H_
#define K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_H_

#include <cstdint>

namespace k3 {

struct MlaCacheWrite {
  int32_t rows = 0;   // new tokens in this call, over all sequences
  int32_t width = 0;  // c + r (K3: 576)
  int32_t page_size = 64;
  int32_t max_pages = 0;                 // the block table's row length
  const float* new_rows = nullptr;       // [rows, width] fp32
  const int32_t* sequence = nullptr;     // [rows]: each row's sequence (its block table row)
  const int32_t* position = nullptr;     // [rows]: each row's token index in its sequence
  const int32_t* block_table = nullptr;  // [sequences, max_pages]
  uint16_t* cache = nullptr;             // bf16 [pages, page_size, width]
};

// Enqueues one launch on `stream` (a cudaStream_t; nullptr for the legacy stream) and returns its
// cudaError_t (0: enqueued); rows < 1, width < 1, page_size < 1 or max_pages < 1 returns
// cudaErrorInvalidValue (1) with nothing enqueued. REQUIRES: every position < page_size x
// max_pages, and its page entry names a page of the pool (the caller allocates pages before).
int LaunchMlaCacheWrite(const MlaCacheWrite& write, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_H_
