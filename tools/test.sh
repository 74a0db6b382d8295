#!/usr/bin/env bash
# Builds k3serve and runs its whole test suite: the README's test command, and what CI runs.
# Installs missing Debian packages first. With CI=true it also runs, under AddressSanitizer and
# UndefinedBehaviorSanitizer, every test that does not link gRPC (the parsers of untrusted bytes,
# the kernels, the mixers, the reference, the transports), the runtime's tests (cluster/) under
# ThreadSanitizer, and stops the Bazel server at the end.
# Ends with how many tests passed, failed and were skipped (and why).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh

# Installs the npm packages locked in folder $1, quietly; fails without the registry.
npm_ci() { (cd "$1" && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1); }

# The tokenizer's reference encoders (js-tiktoken) come from npm; without them its reference test
# reports itself skipped.
if command -v npm >/dev/null; then
  npm_ci tokenizer/reference ||
    echo "tokenizer: npm ci failed; the js-tiktoken reference checks will be skipped" >&2
  # The official OpenAI client that //tests:http_front_test drives the HTTP front with.
  npm_ci tests/openai_client ||
    echo "tests: npm ci failed; the openai client checks will be skipped" >&2
fi

status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... 2>&1 | tee "$log" || status=$?
summary=$(tools/test_summary.sh "$log")

# The package layering (docs/ARCHITECTURE.md), checked on the dependency graph.
tools/check_layering.sh || status=1

# The Kubernetes manifests: every overlay rendered with kubectl's kustomize, validated offline
# against the API schemas and sized with the k3serve binary built above (needs Node.js and the npm
# registry, skipped with a message where either is missing; validate.mjs itself says so and
# skips where kubectl is missing).
if command -v node >/dev/null && command -v npm >/dev/null; then
  if npm_ci k8s; then
    (cd k8s && node validate.mjs) || status=1
    # The cpu overlay's pods as local processes, serving a chat request (skips without kubectl).
    (cd k8s && node simulate.mjs) || status=1
  else
    echo "k8s: skipped manifest validation (npm ci failed: no registry?)" >&2
  fi
else
  echo "k8s: skipped manifest validation (no node/npm)" >&2
fi

if [ "${CI:-}" = "true" ] && [ $status -eq 0 ]; then
  # Targets that cannot build on this machine (the CUDA tests without the toolkit: if_cuda makes
  # them incompatible). `bazel test //...` skips them, but naming one is an error.
  incompatible='attr(target_compatible_with, "missing_prerequisite", tests(//...))'
  sanitized=$(bazel query "tests(//...) except rdeps(tests(//...), //third_party:grpc)
                          except attr(tags, \"no-asan\", tests(//...)) except $incompatible" 2>/dev/null)
  # shellcheck disable=SC2086
  bazel test --config=asan $sanitized || status=$?
  # ThreadSanitizer over the runtime's tests: actor, transports, peer links, gRPC and metrics
  # servers (the NCCL tests need a GPU, and NCCL and CUDA are not instrumented).
  threaded=$(bazel query "tests(//cluster/...) except attr(tags, \"\\bgpu\\b\", tests(//cluster/...))
                         except $incompatible" 2>/dev/null)
  # shellcheck disable=SC2086
  bazel test --config=tsan $threaded || status=$?
fi

if [ "${CI:-}" = "true" ]; then
  bazel shutdown
fi
echo "$summary"
exit $status
