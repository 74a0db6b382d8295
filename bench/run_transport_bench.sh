#!/usr/bin/env bash
# Runs bench/transport_bench and, in the same run, ucx_perftest's UCP active-message tests at the
# same message sizes and UCX_TLS, and prints how far the transport is from raw UCX.
#
#   bench/run_transport_bench.sh                       # shared memory (UCX_TLS=sm,self)
#   TLS=tcp NET_DEVICES=lo bench/run_transport_bench.sh
#
# Environment: TLS, NET_DEVICES, TOKENS (1,16,128), HIDDEN (512), VALUE_BYTES (4), EXPERTS (3),
# SECONDS_PER_SHAPE (1), BUSY_POLL_US (100, the nodes' default --busy-poll-us; 0: receivers sleep in
# poll() at once), EAGER_LIMIT (1m, the nodes' default --ucx-eager-limit: messages up to it go
# eagerly; ucx_perftest gets the same as UCX_RNDV_THRESH, so both use the same protocol; "auto":
# UCX's own threshold for both), BENCH (path of a built transport_bench).
#
# Comparison: transport_bench with one expert is a ping-pong (send a block, get a same-size answer),
# so its round time is set against twice ucp_am_lat's one-way latency (ucx_perftest busy-polls; the
# transport polls for BUSY_POLL_US, yielding its core, then sleeps in poll()). Bandwidth is set against ucp_am_bw (streaming, one
# direction, many messages in flight), which a ping-pong cannot reach; it bounds what is possible.
set -euo pipefail

TLS=${TLS:-sm,self}
NET_DEVICES=${NET_DEVICES:-}
TOKENS=${TOKENS:-1,16,128}
HIDDEN=${HIDDEN:-512}
VALUE_BYTES=${VALUE_BYTES:-4}
EXPERTS=${EXPERTS:-3}
SECONDS_PER_SHAPE=${SECONDS_PER_SHAPE:-1}
BUSY_POLL_US=${BUSY_POLL_US:-100}
EAGER_LIMIT=${EAGER_LIMIT:-1m}
cd "$(dirname "$0")/.."
BENCH=${BENCH:-bazel-bin/bench/transport_bench}
if [[ ! -x "$BENCH" ]]; then
  bazel build //bench:transport_bench
fi
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }

export UCX_TLS="$TLS"
export UCX_RNDV_THRESH="$EAGER_LIMIT"
if [[ -n "$NET_DEVICES" ]]; then export UCX_NET_DEVICES="$NET_DEVICES"; fi

server_pid=""
cleanup() { if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

# perftest TEST SIZE ITERS: prints "p50_us avg_us MBps" from the client's final line.
perftest() {
  local test=$1 size=$2 iters=$3 port=$((20000 + RANDOM % 20000)) line
  ucx_perftest -t "$test" -s "$size" -n "$iters" -w $((iters / 10 + 1)) -p "$port" -f \
    >/dev/null 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do
    if ss -ltn 2>/dev/null | grep -q ":$port "; then break; fi
    sleep 0.05
  done
  line=$(ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -w $((iters / 10 + 1)) \
           -p "$port" -f 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $2, $3, $5}' | tail -1)
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  echo "${line:-nan nan nan}"
}

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }

echo "# UCX_TLS=$UCX_TLS UCX_NET_DEVICES=${UCX_NET_DEVICES:-<default>} hidden=$HIDDEN x ${VALUE_BYTES}B busy_poll_us=$BUSY_POLL_US UCX_RNDV_THRESH=$UCX_RNDV_THRESH"
one=$("$BENCH" --experts=1 --tokens="$TOKENS" --hidden="$HIDDEN" --value-bytes="$VALUE_BYTES" \
        --seconds="$SECONDS_PER_SHAPE" --tls "$TLS" --net-devices "$NET_DEVICES" \
        --busy-poll-us="$BUSY_POLL_US")
many=$("$BENCH" --experts="$EXPERTS" --tokens="$TOKENS" --hidden="$HIDDEN" \
         --value-bytes="$VALUE_BYTES" --seconds="$SECONDS_PER_SHAPE" --tls "$TLS" \
         --net-devices "$NET_DEVICES" --busy-poll-us="$BUSY_POLL_US")
echo "$many" | grep -v '^#' | sed "s/^/E=$EXPERTS /"

printf '%-8s %-9s | %-26s | %-26s | %-8s | %-24s | %-16s | %-16s | %s\n' tokens bytes \
  "transport E=1 p50 round us" "ucp_am_lat 2x one-way us" "ratio" "transport E=1 GB/s" \
  "ucp_am_bw GB/s" "E=$EXPERTS p50 us" "E=$EXPERTS / E=1"
IFS=',' read -ra shapes <<< "$TOKENS"
for tokens in "${shapes[@]}"; do
  row=$(echo "$one" | grep "^tokens=$tokens ")
  bytes=$(echo "$row" | field bytes_per_peer)
  ours_p50=$(echo "$row" | field p50_us)
  ours_gbps=$(echo "$row" | field GBps)
  iters=$((bytes > 65536 ? 2000 : 20000))
  read -r lat_p50 _ _ <<< "$(perftest ucp_am_lat "$bytes" "$iters")"
  read -r _ _ bw_mbps <<< "$(perftest ucp_am_bw "$bytes" "$iters")"
  many_p50=$(echo "$many" | grep "^tokens=$tokens " | field p50_us)
  awk -v t="$tokens" -v b="$bytes" -v o="$ours_p50" -v l="$lat_p50" -v g="$ours_gbps" \
      -v w="$bw_mbps" -v m="$many_p50" 'BEGIN {
        printf "%-8s %-9s | %-26.1f | %-26.2f | %-8.1f | %-24.3f | %-16.3f | %-16.1f | %.1f\n",
               t, b, o, 2 * l, (l > 0 ? o / (2 * l) : 0), g, w / 1000, m, (o > 0 ? m / o : 0) }'
done
