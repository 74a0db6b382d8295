#!/usr/bin/env bash
# Builds k3serve and runs its whole test suite: the README's test command, and what CI runs.
# Installs missing Debian packages first. With CI=true it also runs the unit tests under
# AddressSanitizer + UndefinedBehaviorSanitizer and stops the Bazel server at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh

jobs=$(nproc)
status=0
bazel test --jobs="$jobs" //... || status=$?

if [ "${CI:-}" = "true" ] && [ $status -eq 0 ]; then
  # The sanitizers cover the code that parses untrusted bytes and the numeric kernels; the
  # multi-process cluster tests run without them (their processes are the plain build).
  bazel test --config=asan --jobs="$jobs" \
    //model/... //kernels/... //router/... //expert_nodes/... //reference/... \
    //attention_nodes:all //cluster:actor_test || status=$?
fi

if [ "${CI:-}" = "true" ]; then
  bazel shutdown
fi
exit $status
