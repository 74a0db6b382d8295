#!/usr/bin/env bash
# Builds and runs the GPU tests (Bazel tests tagged "gpu": the NCCL all-to-all) on a machine with a
# GPU, and prints their full logs. Without Bazel on the machine it compiles the NCCL test directly
# with g++ against the same system libraries. Exit status: that of the tests.
#
#   tools/gpu_check.sh
#
# Expect "[  PASSED  ]" with no "skipped: no GPU" line; with one GPU the multi-GPU test is skipped
# (the two-process tests cover two ranks on one device).
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L || true
else
  echo "warning: nvidia-smi not found; the tests will report whether CUDA sees a GPU"
fi

if command -v bazel >/dev/null && [[ -z "${K3_GPU_CHECK_NO_BAZEL:-}" ]]; then
  mapfile -t tests < <(bazel query --keep_going 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
  if [[ ${#tests[@]} -eq 0 ]]; then
    echo "no tests tagged gpu"
    exit 1
  fi
  exec bazel test --test_output=all --cache_test_results=no "${tests[@]}"
fi

CUDA=${CUDA_PATH:-/usr/local/cuda}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "building cluster/nccl_transport_test with g++ (no Bazel)"
# shellcheck disable=SC2046
g++ -std=c++20 -O2 -I. -I"$CUDA/include" -I"$CUDA/include/cccl" \
  cluster/nccl_transport.cc cluster/child_process.cc cluster/nccl_transport_test.cc \
  -o "$out/nccl_transport_test" \
  -L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lcudart -lnccl -lgtest -lglog -lgflags \
  $(pkg-config --libs absl_status absl_statusor absl_strings absl_time absl_synchronization) \
  -pthread
"$out/nccl_transport_test"
