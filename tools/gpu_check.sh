#!/usr/bin/env bash
# Runs the GPU tests and benchmarks of a folder made by tools/gpu_bundle.sh, on a GPU machine, in
# stages, the fastest and most telling first, each with its own time cap:
#   probe       the GPU, driver, where cudart/cuBLAS/NCCL and the tools are, whether every binary
#               loads, and the machine code's HMMA and LDL/STL counts (cuobjdump)
#   kernels     each kernel unit test, then again under compute-sanitizer memcheck (k3-tiny-sized
#               cases) and racecheck (the kernels that use shared memory)
#   layers      the GPU layers against their CPU twins
#   engine      the whole model on one GPU against the CPU engine, the GPU expert worker
#   cluster     NCCL, device channels, a local cluster on the GPU
#   benchmarks  the copy rate, bf16 peak, expert kernels, attention kernels, k3-slice steps
# It prints its plan first (the stages' caps add up to K3_GPU_CHECK_SECONDS, default 420: under
# 7 minutes, leaving time in a device call for a rerun); time a stage does not use passes to the
# next. It ends with one table: each run's verdict and the measured fractions (issues 20 and 21).
# The log (gpu_check.log) and the table (summary.txt) go to $OUT (the device tool's folder) if set,
# else to gpu_check_logs/ beside this script. Exit status 0 only when every run passed and no test
# skipped itself for want of a GPU; a tool that is missing or cannot attach to the device is
# reported as MISSING or NOT AVAILABLE in the table, never left out, and does not fail the run.
#
#   .gpu_bundle/gpu_check.sh        # from anywhere; docs/GPU.md says how to get there
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/bin" ]; then
  echo "gpu_check: no bin/ beside this script: run tools/gpu_bundle.sh and use the copy in its folder" >&2
  exit 2
fi
logs=${OUT:-$here/gpu_check_logs}
mkdir -p "$logs"
exec > >(tee "$logs/gpu_check.log") 2>&1
scratch=$(mktemp -d)
export TEST_TMPDIR=$(mktemp -d)  # the tests are Bazel tests: scratch files go there
trap 'rm -rf "$TEST_TMPDIR" "$scratch"' EXIT
budget=${K3_GPU_CHECK_SECONDS:-420}
start=$SECONDS

# ---- the plan: stage caps (seconds) and runs ("mode binary cap [gtest filter]") -------------
# mode: test (GoogleTest binary), memcheck / racecheck (the test under compute-sanitizer),
# bench (a benchmark). The caps are each run's own limit; a stage's runs also stop at its cap.
# In the kernels stage the sanitizer runs come after every plain run, the ones on the code the
# first GPU run doubts most (the expert kernels, grouping and gate; MLA and KDA) first.
stages=(probe kernels layers engine cluster benchmarks)
declare -A cap=([probe]=25 [kernels]=140 [layers]=35 [engine]=75 [cluster]=75 [benchmarks]=70)
# Scale the caps when K3_GPU_CHECK_SECONDS asks for another total.
planned=0
for s in "${stages[@]}"; do planned=$((planned + cap[$s])); done
if [ "$budget" -ne "$planned" ]; then
  for s in "${stages[@]}"; do cap[$s]=$((cap[$s] * budget / planned)); done
fi
# k3-tiny-sized cases of the bigger kernel tests (the sanitizers slow kernels 10-100x).
kda_small='KdaPrefill*:*K3Tiny*:*KimiLinear*:*Refuses*'
mla_small='*K3Tiny*:*Refuses*:*KeysPerSplit*'
experts_small='*K3Tiny*:*DeviceRouting*:*Repeated*:*BadInput*'
declare -A runs
runs[kernels]="
test moe_mxfp4_test 20
test glu_test 20
test moe_gate_test 20
test rms_norm_test 20
test attn_res_test 20
test mla_cache_test 20
test kda_decode_test 30
test mla_decode_test 30
test cublas_products_test 30
test gpu_expert_compute_test 40
memcheck gpu_expert_compute_test 30 $experts_small
memcheck moe_gate_test 20
memcheck mla_decode_test 25 $mla_small
memcheck kda_decode_test 25 $kda_small
memcheck mla_cache_test 20
memcheck rms_norm_test 20
memcheck attn_res_test 20
memcheck glu_test 20
memcheck moe_mxfp4_test 20
memcheck cublas_products_test 25
racecheck gpu_expert_compute_test 30 $experts_small
racecheck moe_gate_test 20
racecheck mla_decode_test 25 $mla_small
racecheck kda_decode_test 25 $kda_small
racecheck rms_norm_test 20
racecheck attn_res_test 20"
runs[layers]="
test gpu_gated_mlp_test 20
test gpu_kda_layer_test 30
test gpu_mla_layer_test 30"
runs[engine]="
test gpu_engine_test 60
test gpu_step_runner_test 40
test gpu_expert_worker_test 40"
runs[cluster]="
test nccl_transport_test 30
test nccl_device_channel_test 40
test gpu_cluster_test 60"
runs[benchmarks]="
bench moe_mxfp4_bench 25
bench attention_gpu_bench 25
bench gpu_expert_bench 25
bench gpu_step_bench 60"

echo "== plan: ${budget} s in all"
for s in "${stages[@]}"; do
  printf '  %-11s %4d s' "$s" "${cap[$s]}"
  if [ "$s" = probe ]; then echo "  (GPU, libraries, tools, loading, machine code)"; continue; fi
  echo "  ($(awk 'NF {printf "%s%s %s", sep, $1, $2; sep=", "}' <<<"${runs[$s]}"))"
done
listed=$(for s in "${stages[@]}"; do awk 'NF {print $2}' <<<"${runs[$s]:-}"; done | sort -u)
for binary in "$here"/bin/*; do
  grep -qx "$(basename "$binary")" <<<"$listed" ||
    echo "  NOTE: bin/$(basename "$binary") is in no stage (add it to gpu_check.sh's plan)"
done

results=()  # "stage|run|verdict|seconds|note"
failed=0
record() {
  results+=("$1|$2|$3|$4|$5")
  case "$3" in
    PASSED|MISSING*|"NOT AVAILABLE"*) ;;
    *) failed=1 ;;
  esac
}

# ---- probe -------------------------------------------------------------------------------------
stage_start=$SECONDS
echo
echo "== probe"
if command -v nvidia-smi >/dev/null; then
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv || true
else
  echo "nvidia-smi: MISSING"
fi

# CUDA installs: CUDA_HOME/CUDA_PATH, /usr/local/cuda*, /opt, and the one nvcc is in.
cuda_dirs=()
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-* /opt/cuda /opt/nvidia/cuda*; do
  [ -n "$d" ] && [ -d "$d" ] && cuda_dirs+=("$(cd "$d" && pwd -P)")
done
if command -v nvcc >/dev/null; then cuda_dirs+=("$(cd "$(dirname "$(command -v nvcc)")/.." && pwd -P)"); fi
mapfile -t cuda_dirs < <(printf '%s\n' "${cuda_dirs[@]}" | awk 'NF && !seen[$0]++')
echo "CUDA installs: ${cuda_dirs[*]:-none found}"
for d in "${cuda_dirs[@]}"; do
  [ -x "$d/bin/nvcc" ] && { "$d/bin/nvcc" --version | tail -1; break; }
done

# A tool on PATH or anywhere under a CUDA install; empty if none.
find_tool() {
  local name=$1 found
  found=$(command -v "$name" 2>/dev/null) && { echo "$found"; return; }
  for d in "${cuda_dirs[@]}"; do
    for candidate in "$d/bin/$name" "$d/$name/$name" "$d/extras/$name/$name"; do
      [ -x "$candidate" ] && { echo "$candidate"; return; }
    done
    found=$(timeout 10 find "$d" -maxdepth 4 -name "$name" -type f -perm -u+x 2>/dev/null | head -1)
    [ -n "$found" ] && { echo "$found"; return; }
  done
}
sanitizer=$(find_tool compute-sanitizer)
cuobjdump=$(find_tool cuobjdump)
echo "compute-sanitizer: ${sanitizer:-MISSING (the memcheck and racecheck runs are reported MISSING)}"
echo "cuobjdump: ${cuobjdump:-MISSING (no machine-code counts)}"

# cudart/cuBLAS/NCCL for the binaries linked to them dynamically: the loader cache, the CUDA
# installs, and Python packages' copies (site-packages/nvidia/*/lib, e.g. PyTorch's).
wanted='libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2'
candidates=()
while read -r path; do candidates+=("$(dirname "$path")"); done < <(
  ldconfig -p 2>/dev/null | awk '$1 ~ /^lib(cudart|cublas|cublasLt|nccl)\.so/ {print $NF}')
for d in "${cuda_dirs[@]}"; do candidates+=("$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"); done
site_dirs=$(for py in python3 /usr/bin/python3 /opt/*/bin/python3 /usr/local/bin/python3; do
  command -v "$py" >/dev/null 2>&1 &&
    timeout 10 "$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null
done; timeout 8 find / -xdev -maxdepth 7 -type d -name site-packages -not -path '/proc/*' 2>/dev/null)
for sp in $(awk 'NF && !seen[$0]++' <<<"$site_dirs"); do
  for lib in "$sp"/nvidia/*/lib; do [ -d "$lib" ] && candidates+=("$lib"); done
done
lib_path=""
for soname in $wanted; do
  where=""
  for d in "${candidates[@]}"; do
    [ -e "$d/$soname" ] && { where=$d; break; }
  done
  echo "$soname: ${where:-MISSING}"
  [ -n "$where" ] && [[ ":$lib_path:" != *":$where:"* ]] && lib_path="$lib_path:$where"
done
export LD_LIBRARY_PATH="$here/lib$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

load_failures=${#results[@]}
# Every binary loads: nothing unresolved but the driver's own library (libcuda, absent on a
# machine without a driver), and nothing taken from outside lib/ but the C/C++ runtime and CUDA.
for binary in "$here"/bin/* "$here/k3serve"; do
  [ -f "$binary" ] || continue
  name=$(basename "$binary")
  deps=$(ldd "$binary" 2>&1)
  missing=$(awk '/not found/ && $1 !~ /^libcuda\.so/ {print $1}' <<<"$deps" | paste -sd' ')
  outside=$(awk -v lib="$here/lib/" '$2 == "=>" && $3 ~ /^\// && index($3, lib) != 1 {print $1}' <<<"$deps" |
    grep -vE '^(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|ld-linux[^ ]*)\.so' | paste -sd' ')
  if [ -n "$missing" ]; then
    record probe "loads $name" "FAILED (missing: $missing)" 0 ""
  elif [ -n "$outside" ]; then
    record probe "loads $name" "FAILED (not in lib/: $outside)" 0 ""
  fi
done
if [ ${#results[@]} -eq "$load_failures" ]; then
  echo "loading: all $(ls "$here"/bin | wc -l) binaries and k3serve load (ldd: nothing missing but the driver's libcuda, nothing from outside lib/ but the C/C++ runtime and CUDA)"
else
  echo "loading: $((${#results[@]} - load_failures)) failures (in the table)"
fi

if [ -n "$cuobjdump" ]; then
  echo "machine code (sm_90a):"
  for binary in "$here"/bin/*; do
    if [ $((SECONDS - stage_start)) -ge "${cap[probe]}" ]; then
      record probe "machine code" "NOT RUN (probe cap) from $(basename "$binary") on" 0 ""
      break
    fi
    sass=$(timeout 10 "$cuobjdump" --dump-sass "$binary" 2>/dev/null) || continue
    [ -n "$sass" ] || continue
    hmma=$(grep -c HMMA <<<"$sass")
    local_memory=$(grep -cE '\b(LDL|STL)\b' <<<"$sass")
    echo "  $(basename "$binary"): HMMA $hmma, LDL/STL $local_memory"
    [ "$local_memory" -eq 0 ] || record probe "sass $(basename "$binary")" "FAILED (LDL/STL $local_memory)" 0 ""
  done
else
  record probe "machine code" "MISSING (no cuobjdump)" 0 ""
fi
carry=$((cap[probe] - (SECONDS - stage_start)))

# ---- the stages --------------------------------------------------------------------------------
# One run: its verdict from the exit status and the log.
verdict_of() {  # mode status log
  local mode=$1 status=$2 log=$3
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then echo "TIMEOUT"; return; fi
  if [[ $mode == memcheck || $mode == racecheck ]]; then
    if grep -qE 'ERROR SUMMARY: [1-9]' "$log"; then echo "FAILED (sanitizer errors)"; return; fi
    if ! grep -q '^\[==========\]' "$log" &&
       grep -qiE 'not supported|unable to|could not|failed to (attach|initialize|launch)' "$log"; then
      echo "NOT AVAILABLE (the sanitizer could not attach)"; return
    fi
  fi
  if [ "$status" -ne 0 ]; then echo "FAILED ($status)"; return; fi
  if grep -q "skipped: no GPU" "$log"; then echo "SKIPPED: no GPU"; return; fi
  echo PASSED
}

for s in "${stages[@]}"; do
  [ "$s" = probe ] && continue
  stage_start=$SECONDS
  deadline=$((stage_start + cap[$s] + (carry > 0 ? carry : 0)))
  [ $deadline -le $((start + budget)) ] || deadline=$((start + budget))
  echo
  echo "== stage $s: until +$((deadline - start)) s"
  while read -r mode name limit filter; do
    [ -n "${mode:-}" ] || continue
    if [ "$mode" = test ] || [ "$mode" = bench ]; then run=$name; else run="$name ($mode)"; fi
    binary="$here/bin/$name"
    if [ ! -x "$binary" ]; then record "$s" "$run" "NOT IN BUNDLE" 0 ""; continue; fi
    if [[ $mode == memcheck || $mode == racecheck ]] && [ -z "$sanitizer" ]; then
      record "$s" "$run" "MISSING (no compute-sanitizer)" 0 ""
      continue
    fi
    left=$((deadline - SECONDS))
    if [ $left -lt 5 ]; then record "$s" "$run" "NOT RUN (stage cap)" 0 ""; continue; fi
    limit=$((limit < left ? limit : left))
    log="$scratch/$name.$mode.log"
    args=()
    [ "$mode" = bench ] || args=(--gtest_color=no)
    [ -n "${filter:-}" ] && args+=("--gtest_filter=$filter")
    command=("$binary" "${args[@]}")
    [[ $mode == memcheck || $mode == racecheck ]] &&
      command=("$sanitizer" --tool "$mode" --error-exitcode 99 "${command[@]}")
    echo
    echo "-- $run (limit ${limit}s)"
    t0=$SECONDS
    # From the bundle's folder: the cluster tests start ./k3serve.
    (cd "$here" && timeout -k 5 "$limit" "${command[@]}") </dev/null >"$log" 2>&1
    status=$?
    if [[ $mode == memcheck || $mode == racecheck ]]; then tail -5 "$log"; else cat "$log"; fi
    verdict=$(verdict_of "$mode" "$status" "$log")
    note=$(grep -m1 -E "ERROR SUMMARY|skipped: no GPU|^\[  FAILED  \]|^copy:|^round trips:|^verdict:" "$log" | cut -c1-70)
    record "$s" "$run" "$verdict" $((SECONDS - t0)) "$note"
  done <<<"${runs[$s]}"
  carry=$((deadline - SECONDS))
done

# ---- the table ---------------------------------------------------------------------------------
{
  echo
  echo "== summary: $((SECONDS - start)) s of ${budget} s planned"
  printf '%-11s %-38s %-32s %5s  %s\n' stage run result s note
  for row in "${results[@]}"; do
    IFS='|' read -r stage run verdict seconds note <<<"$row"
    printf '%-11s %-38s %-32s %5s  %s\n' "$stage" "$run" "$verdict" "$seconds" "$note"
  done
  # The measured fractions, from the benchmarks' own tables (absent if they did not run).
  step_log="$scratch/gpu_step_bench.bench.log"
  moe_log="$scratch/moe_mxfp4_bench.bench.log"
  attention_log="$scratch/attention_gpu_bench.bench.log"
  echo
  echo "measured (fractions of this machine's device-to-device copy rate):"
  for log in "$step_log" "$moe_log" "$attention_log"; do
    [ -f "$log" ] && grep -m1 '^copy:' "$log" | sed "s/^/  $(basename "$log" .bench.log) /"
  done
  [ -f "$moe_log" ] && awk '$1 == "rows/expert" {on = 1; next}
    on && ($1 == 1 || $1 == 4 || $1 == 16) {printf "  MXFP4 experts, %2d rows/expert: %s of copy (issue 20 goal 0.7), %s us/call\n", $1, $5, $2}' "$moe_log"
  [ -f "$attention_log" ] && awk '$1 == "kind" {on = 1; next}
    on && NF >= 7 {printf "  %-6s batch %2d context %5d: %s of copy, %s us/call\n", $1, $2, $3, $7, $4}' "$attention_log"
  [ -f "$step_log" ] && awk '$1 == "routing" {on = 1; next}
    on && NF >= 9 && $2 ~ /^[0-9]+$/ {printf "  k3-slice %-9s batch %2d: %s ms/step, %s x its floor (issue 21: <= 1.5 at batch 1)\n", $1, $2, $3, $8}
    /^verdict:/ {print "  " $0}' "$step_log"
  echo "exit status: $failed (0: every run passed)"
} | tee "$logs/summary.txt"
exit $failed
