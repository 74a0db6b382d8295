#!/usr/bin/env bash
# Builds the GPU tests and benchmarks (Bazel cc_test/cc_binary targets tagged "gpu") on a machine
# with the CUDA Toolkit and copies them into one folder for a GPU machine that has a driver, CUDA
# and Python but none of the project's Debian libraries: bin/ (the stripped binaries), lib/ (every
# shared library `ldd` finds for them except the C/C++ runtime, which the GPU machine has, and
# CUDA's own cudart/cuBLAS/NCCL, which it has in newer form) and gpu_check.sh, which runs them
# there. Fails if the folder exceeds 64 MiB (what travels to a GPU machine).
#
#   tools/gpu_bundle.sh [FOLDER]     # default .gpu_bundle (git-ignored)
#
# docs/GPU.md says how to run the result.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu_bundle}
limit=$((64 * 1024 * 1024))

if [ ! -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "gpu_bundle: no CUDA Toolkit at ${CUDA_PATH:-/usr/local/cuda}; nothing to build" >&2
  exit 1
fi
mapfile -t targets < <(bazel query --noshow_progress \
  'attr(tags, "\bgpu\b", kind("cc_test|cc_binary", //...))' 2>/dev/null)
if [ ${#targets[@]} -eq 0 ]; then
  echo "gpu_bundle: no targets tagged gpu" >&2
  exit 1
fi
bazel build --jobs="${K3_BUILD_JOBS:-2}" "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bin_dir=$(bazel info bazel-bin 2>/dev/null)
for target in "${targets[@]}"; do
  path="${target#//}"
  path="$bin_dir/${path/://}"
  cp "$path" "$out/bin/"
  chmod u+w "$out/bin/$(basename "$path")"
  strip --strip-debug "$out/bin/$(basename "$path")"
  # name => /path (address): keep resolved paths of libraries the GPU machine lacks.
  ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name lib; do
    case "$name" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|\
      libstdc++.so*|libgcc_s.so*|libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$out/lib/$name" ;;
    esac
  done
done
cp tools/gpu_check.sh "$out/"
size=$(du -sb "$out" | cut -f1)
echo "gpu_bundle: ${#targets[@]} binaries, $(ls "$out/lib" | wc -l) libraries, $((size / 1024 / 1024)) MiB in $out"
ls "$out/bin"
if [ "$size" -gt "$limit" ]; then
  echo "gpu_bundle: $out is over 64 MiB" >&2
  exit 1
fi
