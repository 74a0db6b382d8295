#!/usr/bin/env bash
# The README's main job: builds k3serve, writes a small random-weight K3 checkpoint, starts a local
# cluster (coordinator, attention worker, router, two expert workers as separate processes),
# generates from it over gRPC, checks the tokens against the single-process engine; then the same
# with `k3serve serve` (every tier in one process, for one machine); then asks a running local
# cluster a text question through the OpenAI-compatible HTTP front, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh
bazel build //:k3serve
k3serve=bazel-bin/k3serve

work=${K3SERVE_DEMO_DIR:-/tmp/k3serve-demo}
rm -rf "$work"
mkdir -p "$work"
"$k3serve" random-checkpoint --config k3-tiny --seed 1 --out "$work/model"

prompt=1,2,3,4,5
echo "single process:"
"$k3serve" generate --model "$work/model" --tokens "$prompt" --max-new-tokens 16 | tee "$work/local.txt"
echo "local cluster (1 attention worker, 1 router, 2 expert workers):"
"$k3serve" local --model "$work/model" --attention 1 --routers 1 --experts 2 \
  --log-dir "$work/logs" --prompt "$prompt" --max-new-tokens 16 | tee "$work/cluster.txt"
if grep -qxF "$(cat "$work/local.txt")" "$work/cluster.txt"; then
  echo "the cluster generated the same tokens as the single-process engine"
else
  echo "the cluster's tokens differ from the single-process engine's" >&2
  exit 1
fi

echo "one process serving gRPC and the OpenAI HTTP API (k3serve serve: every tier in process):"
"$k3serve" serve --model "$work/model" --host 127.0.0.1 --port 0 --http-port 0 \
  >"$work/serve-addresses.txt" 2>"$work/serve.log" &
serve=$!
trap 'kill -TERM $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q '^http address: ' "$work/serve-addresses.txt" && break
  kill -0 $serve 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
grpc=$(sed -n 's/^generate address: //p' "$work/serve-addresses.txt")
[ -n "$grpc" ] || { echo "k3serve serve did not start" >&2; exit 1; }
"$k3serve" generate --server "$grpc" --tokens "$prompt" --max-new-tokens 16 --temperature 0 |
  tee "$work/serve.txt"
if cmp -s "$work/local.txt" "$work/serve.txt"; then
  echo "k3serve serve generated the same tokens as the single-process engine"
else
  echo "k3serve serve's tokens differ from the single-process engine's" >&2
  exit 1
fi
serve_http=$(sed -n 's/^http address: //p' "$work/serve-addresses.txt")
curl -sS "http://$serve_http/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\":[${prompt}],\"max_tokens\":8,\"temperature\":0}"
echo
kill -TERM $serve
wait $serve
trap - EXIT

echo "a text question through the OpenAI-compatible HTTP front (/v1/chat/completions, streaming):"
"$k3serve" local --model "$work/model" --attention 1 --routers 1 --experts 2 \
  --log-dir "$work/logs-http" >"$work/addresses.txt" 2>"$work/local.log" &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster 2>/dev/null || true' EXIT
# The launcher prints the front's address once the whole cluster is ready.
for _ in $(seq 600); do
  grep -q '^http address: ' "$work/addresses.txt" && break
  kill -0 $cluster 2>/dev/null || { cat "$work/local.log" >&2; exit 1; }
  sleep 0.1
done
http=$(sed -n 's/^http address: //p' "$work/addresses.txt")
[ -n "$http" ] || { echo "the local cluster did not start its HTTP front" >&2; exit 1; }
question="Why is the sky blue?"
echo "Q: $question"
printf 'A: '
curl -sS -N "http://$http/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"max_tokens\":24,\"stream\":true,\"chat_template_kwargs\":{\"thinking\":false}}" |
  python3 -c '
import json, sys
for line in sys.stdin:  # server-sent events: "data: {...}" lines, then "data: [DONE]"
    line = line.strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    for choice in json.loads(line[6:])["choices"]:
        print(choice["delta"].get("content", ""), end="", flush=True)
print()'
echo "(random weights: the answer is gibberish; the plumbing is what is shown)"
