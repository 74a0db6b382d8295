#!/usr/bin/env bash
# The README's main job: builds k3serve, writes a small random-weight K3 checkpoint, starts a local
# cluster (coordinator, attention worker, router, two expert workers as separate processes),
# generates from it over gRPC, checks the tokens against the single-process engine, and stops.
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
