// The instruction-set family of the matrix kernels (kernels/matmul.h): the widest the CPU runs,
// unless K3SERVE_ISA=avx512|avx2|portable asks for a lower one (tests and A/B runs on one machine).
//
// Chosen once per process, on the first call of ActiveKernelIsa(), which logs the choice; every
// function here is thread-safe. The GCC target_clones code (kernels/simd.h: RMSNorm, the attention
// mixers) is chosen by the loader from the CPU alone and does not follow K3SERVE_ISA.
#ifndef K3SERVE_KERNELS_KERNEL_ISA_H_
#define K3SERVE_KERNELS_KERNEL_ISA_H_

#include <optional>
#include <string_view>

namespace k3 {

// Ordered: a higher value needs every instruction of a lower one.
enum class KernelIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// "portable", "avx2" or "avx512" (the spellings K3SERVE_ISA takes).
const char* KernelIsaName(KernelIsa isa);

// The spelling of KernelIsaName, or nullopt for anything else.
std::optional<KernelIsa> ParseKernelIsa(std::string_view name);

// Whether this CPU runs `isa`'s kernels (AVX2: AVX2 and FMA; AVX-512: F, BW, VL and DQ).
bool CpuSupports(KernelIsa isa);

// The widest family this CPU supports, lowered to K3SERVE_ISA when that is set. An unknown value,
// or one the CPU cannot run, is logged as an error and ignored (the widest supported runs).
KernelIsa ActiveKernelIsa();

}  // namespace k3

#endif  // K3SERVE_KERNELS_KERNEL_ISA_H_
