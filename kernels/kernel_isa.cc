#include "kernels/kernel_isa.h"

#include <cstdlib>

#include "glog/logging.h"

namespace k3 {
namespace {

KernelIsa WidestSupported() {
  if (CpuSupports(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  if (CpuSupports(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kPortable;
}

KernelIsa ChooseIsa() {
  const KernelIsa widest = WidestSupported();
  KernelIsa chosen = widest;
  const char* env = std::getenv("K3SERVE_ISA");
  if (env != nullptr && *env != '\0') {
    const std::optional<KernelIsa> asked = ParseKernelIsa(env);
    if (!asked.has_value()) {
      LOG(ERROR) << "K3SERVE_ISA=" << env << " is not one of avx512, avx2, portable; ignored";
    } else if (!CpuSupports(*asked)) {
      LOG(ERROR) << "K3SERVE_ISA=" << env << ": this CPU does not run those kernels; ignored";
    } else {
      chosen = *asked;
    }
  }
  LOG(INFO) << "matrix kernels: " << KernelIsaName(chosen) << " (widest on this CPU: "
            << KernelIsaName(widest) << (chosen != widest ? ", lowered by K3SERVE_ISA)" : ")");
  return chosen;
}

}  // namespace

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAvx512: return "avx512";
    case KernelIsa::kAvx2: return "avx2";
    default: return "portable";
  }
}

std::optional<KernelIsa> ParseKernelIsa(std::string_view name) {
  for (KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == KernelIsaName(isa)) return isa;
  }
  return std::nullopt;
}

bool CpuSupports(KernelIsa isa) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  switch (isa) {
    case KernelIsa::kAvx512: return avx512;
    case KernelIsa::kAvx2: return avx2;
    default: return true;
  }
#else
  return isa == KernelIsa::kPortable;
#endif
}

KernelIsa ActiveKernelIsa() {
  static const KernelIsa isa = ChooseIsa();
  return isa;
}

}  // namespace k3
