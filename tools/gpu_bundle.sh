#!/usr/bin/env bash
# Builds the GPU tests and benchmarks (Bazel cc_test/cc_binary targets tagged "gpu") on a machine
# with the CUDA Toolkit and copies them into one folder for a GPU machine that has a driver, CUDA
# and Python but none of the project's Debian libraries: bin/ (the stripped binaries), lib/ (every
# shared library `ldd` finds for them except the C/C++ runtime, which the GPU machine has, and
# CUDA's own cudart/cuBLAS/NCCL, which it has in newer form) and gpu_check.sh, which runs them
# there; then packs the folder as FOLDER.tar.gz (what travels to a GPU machine: unpack it there
# with `tar -xzf`; gzip, since a bare machine may lack xz). Fails if the packed bundle exceeds
# 64 MiB.
#
#   tools/gpu_bundle.sh [FOLDER]     # default .gpu_bundle (git-ignored, as is .gpu_bundle.tar.gz)
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
# //:k3serve goes beside bin/: the process-level GPU tests start clusters of it.
bazel build --jobs="${K3_BUILD_JOBS:-2}" "${targets[@]}" //:k3serve

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bin_dir=$(bazel info bazel-bin 2>/dev/null)
# Copies a built binary to folder $2, stripped of every symbol (the bundle must stay under
# 64 MiB), and the libraries it needs that the GPU machine lacks to lib/ (name => /path (address):
# resolved paths only).
carry() {
  cp "$1" "$2/"
  chmod u+w "$2/$(basename "$1")"
  strip --strip-all "$2/$(basename "$1")"
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name lib; do
    case "$name" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|\
      libstdc++.so*|libgcc_s.so*|libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$out/lib/$name" ;;
    esac
  done
}
for target in "${targets[@]}"; do
  path="${target#//}"
  carry "$bin_dir/${path/://}" "$out/bin"
done
carry "$bin_dir/k3serve" "$out"
cp tools/gpu_check.sh "$out/"
rm -f "$out.tar.gz"
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
size=$(stat -c %s "$out.tar.gz")
echo "gpu_bundle: ${#targets[@]} binaries and k3serve, $(ls "$out/lib" | wc -l) libraries," \
  "$(($(du -sb "$out" | cut -f1) / 1024 / 1024)) MiB in $out, $((size / 1024 / 1024)) MiB packed in $out.tar.gz"
ls "$out/bin"
if [ "$size" -gt "$limit" ]; then
  echo "gpu_bundle: $out.tar.gz is over 64 MiB" >&2
  exit 1
fi
