// Batch invariance (issue 39): whether a request's answer may depend on what it is computed with.
//
// When on (the default), every reduction of the forward pass runs in an order fixed by the token's
// own sequence and position alone, never by how many rows share a step or a kernel call, how a
// prompt is cut into steps, whether a prefix came from the prefix cache, or the kernel thread
// count: the matrix products use the row kernel for every token count (its sums per (row, token)
// do not depend on the token grouping), MLA attends in its absorbed form with key splits fixed by
// the key count, KDA prefill runs on the chunk grid of absolute positions (prompts are cut only at
// its multiples) and the prefix cache keeps only states that prefill made. So a request's logits
// are bitwise the same alone and in any batch, within one kernel family (kernels/kernel_isa.h:
// AVX-512 and AVX2 sum in different orders). Off: the fastest kernel and form for each shape.
//
// One process-wide setting, read on every call: K3SERVE_BATCH_INVARIANT=0 in the environment
// turns it off (every role, tool and bench; `k3serve local` children inherit it); tests may set it
// before any step. Thread-safe (an atomic).
#ifndef K3SERVE_BASE_BATCH_INVARIANCE_H_
#define K3SERVE_BASE_BATCH_INVARIANCE_H_

namespace k3 {

bool BatchInvariant();
void SetBatchInvariant(bool on);

}  // namespace k3

#endif  // K3SERVE_BASE_BATCH_INVARIANCE_H_
