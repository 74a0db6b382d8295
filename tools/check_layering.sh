#!/usr/bin/env bash
# Checks the package layering of docs/ARCHITECTURE.md against the Bazel dependency graph: every
# rule below is a set of packages that must not depend (directly or not) on another set. Prints
# each violation with the offending targets; exits 1 if there is any. First it reads the
# sources' #include lines against the same table (tools/check_includes.py, also a bazel test:
# //tools:check_includes_test), so that an include without its BUILD dep is caught too.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
python3 tools/check_includes.py || failed=1

tiers="//attention_nodes/... + //router/... + //expert_nodes/..."
above="//engine/... + //launcher/... + //tools/... + //coordinator/... + //http_front/... + //:k3serve"

# "name|packages|forbidden dependencies"
rules=(
  "base/ may use nothing of the project|//base/...|//... except //base/... except //third_party/..."
  "attention_nodes may not use another tier|//attention_nodes/...|//router/... + //expert_nodes/... + $above"
  "router may not use another tier|//router/...|//attention_nodes/... + //expert_nodes/... + $above"
  "expert_nodes may not use another tier|//expert_nodes/...|//attention_nodes/... + //router/... + $above"
  "moe/ (the contract) may not use a tier|//moe/...|$tiers + $above"
  "cluster/ (the runtime) may not use moe/ or a tier|//cluster/...|//moe/... + $tiers + $above"
  "kernels/ and model/ may not use a transport, moe/ or a tier|//kernels/... + //model/...|//cluster/... + //moe/... + //proto/... + $tiers + $above"
  "coordinator/ may not use a tier|//coordinator/...|$tiers + $above"
  "http_front/ may use only proto/, cluster/ and tokenizer/|//http_front/...|$tiers + //moe/... + //kernels/... + //engine/... + //launcher/... + //tools/... + //coordinator/... + //:k3serve"
  "tokenizer/ may not use a transport, moe/ or a tier|//tokenizer/...|//cluster/... + //moe/... + //proto/... + //kernels/... + $tiers + $above"
  "engine/ may not use the launcher, tools or the coordinator|//engine/...|//launcher/... + //tools/... + //coordinator/... + //:k3serve"
)

for rule in "${rules[@]}"; do
  IFS='|' read -r name from forbidden <<<"$rule"
  # Targets of `from` with a path to a forbidden target: the edges to fix.
  offenders=$(bazel query --noshow_progress \
    "($from) intersect rdeps($from, ($forbidden) except ($from))" 2>/dev/null || echo "query failed")
  if [ -n "$offenders" ]; then
    echo "layering: $name; offending targets:" >&2
    echo "$offenders" | sed 's/^/  /' >&2
    failed=1
  fi
done
[ $failed -eq 0 ] && echo "layering: every package keeps to its layer (${#rules[@]} dependency rules)"
exit $failed
