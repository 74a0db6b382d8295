#!/usr/bin/env bash
# Runs every GPU test and benchmark of a folder made by tools/gpu_bundle.sh, on a GPU machine:
# prints the GPU, the driver and CUDA, runs each binary of bin/ (tests: *_test, under
# GoogleTest; the rest: benchmarks) with lib/ on the library path, runs the expert kernel test's
# k3-tiny cases under compute-sanitizer (memcheck, racecheck) and counts each binary's tensor-core
# HMMA and local-memory LDL/STL instructions where those tools exist, and ends with a table. The
# whole run stays within K3_GPU_CHECK_SECONDS (default 450, under 8 minutes): each binary gets what
# is left, at most 200 s. The log (gpu_check.log) and the table (summary.txt) go to $OUT (the
# device tool's folder) if set, else to gpu_check_logs/ beside this script. Exit status 0 only
# when every binary passed and no test skipped itself for want of a GPU.
#
#   .gpu_bundle/gpu_check.sh        # from anywhere; docs/GPU.md says how to get there
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/bin" ]; then
  echo "gpu_check: no bin/ beside this script: run tools/gpu_bundle.sh and use the copy in its folder" >&2
  exit 2
fi
# One log of everything and the summary table come back (the device tool returns at most 8 files);
# per-binary logs stay in a scratch folder.
logs=${OUT:-$here/gpu_check_logs}
mkdir -p "$logs"
exec > >(tee "$logs/gpu_check.log") 2>&1
scratch=$(mktemp -d)
budget=${K3_GPU_CHECK_SECONDS:-450}
start=$SECONDS

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
else
  echo "nvidia-smi not found"
fi
command -v nvcc >/dev/null && nvcc --version | tail -1

# cudart/cuBLAS/NCCL for binaries linked to them dynamically: the CUDA install or
# the Python packages' copies.
cuda_libs=$(timeout 30 find /usr/local /opt /usr/lib -name 'libnccl.so.2' -o -name 'libcudart.so.13' -o -name 'libcublas.so.13' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH="$here/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The tests are Bazel tests: they write scratch files under TEST_TMPDIR.
export TEST_TMPDIR=$(mktemp -d)
trap 'rm -rf "$TEST_TMPDIR" "$scratch"' EXIT

results=()
failed=0
for binary in "$here"/bin/*; do
  name=$(basename "$binary")
  left=$((budget - (SECONDS - start)))
  if [ $left -lt 10 ]; then
    results+=("$name|NOT RUN (time budget spent)|0|")
    failed=1
    continue
  fi
  limit=$((left < 200 ? left : 200))
  echo
  echo "== $name (limit ${limit}s)"
  t0=$SECONDS
  # From the bundle's folder: the cluster tests start ./k3serve.
  if [[ $name == *_test ]]; then
    (cd "$here" && timeout "$limit" "$binary" --gtest_color=no) 2>&1 | tee "$scratch/$name.log"
  else
    (cd "$here" && timeout "$limit" "$binary") 2>&1 | tee "$scratch/$name.log"
  fi
  status=${PIPESTATUS[0]}
  seconds=$((SECONDS - t0))
  note=$(grep -m1 -E "skipped: no GPU|PASSED|FAILED|^copy:|^round trips:" "$scratch/$name.log" | cut -c1-60)
  if [ "$status" -eq 124 ]; then
    verdict="TIMEOUT"
  elif [ "$status" -ne 0 ]; then
    verdict="FAILED ($status)"
  elif grep -q "skipped: no GPU" "$scratch/$name.log"; then
    verdict="SKIPPED: no GPU"
  else
    verdict="PASSED"
  fi
  [ "$verdict" = PASSED ] || failed=1
  results+=("$name|$verdict|$seconds|$note")
done

# Out-of-bounds accesses and races in the kernels, at k3-tiny's size (fast under the checker).
if command -v compute-sanitizer >/dev/null && [ -x "$here/bin/gpu_expert_compute_test" ]; then
  for tool in memcheck racecheck; do
    left=$((budget - (SECONDS - start)))
    [ $left -ge 30 ] || break
    echo
    echo "== compute-sanitizer --tool $tool (k3-tiny cases)"
    t0=$SECONDS
    timeout $((left < 120 ? left : 120)) compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$here/bin/gpu_expert_compute_test" --gtest_filter='*K3Tiny*:*Repeated*' 2>&1 |
      tee "$scratch/sanitizer_$tool.log" | tail -5
    status=${PIPESTATUS[0]}
    verdict=$([ "$status" -eq 0 ] && echo PASSED || echo "FAILED ($status)")
    [ "$verdict" = PASSED ] || failed=1
    results+=("sanitizer $tool|$verdict|$((SECONDS - t0))|$(grep -m1 'ERROR SUMMARY' "$scratch/sanitizer_$tool.log")")
  done
fi

if command -v cuobjdump >/dev/null; then
  echo
  echo "== machine code (sm_90a)"
  for binary in "$here"/bin/*; do
    sass=$(cuobjdump --dump-sass "$binary" 2>/dev/null) || continue
    [ -n "$sass" ] || continue
    printf '%s: HMMA %s, LDL/STL %s\n' "$(basename "$binary")" \
      "$(grep -c HMMA <<<"$sass")" "$(grep -cE '\b(LDL|STL)\b' <<<"$sass")"
  done
fi

echo
echo "== summary ($((SECONDS - start)) s)"
printf '%-28s %-22s %6s  %s\n' binary result seconds note
for row in "${results[@]}"; do
  IFS='|' read -r name verdict seconds note <<<"$row"
  printf '%-28s %-22s %6s  %s\n' "$name" "$verdict" "$seconds" "$note"
done | tee "$logs/summary.txt"
for log in "$scratch"/*_bench.log; do  # every benchmark's table, from its copy rate on
  [ -f "$log" ] && { echo; sed -nE '/^(copy|round trips):/,$p' "$log"; }
done
exit $failed
