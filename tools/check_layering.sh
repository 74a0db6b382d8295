#!/usr/bin/env bash
# Checks the package layering of docs/ARCHITECTURE.md on the sources' #include lines and on the
# Bazel dependency graph. The table is written once, as ALLOWED in tools/check_includes.py:
#  - check_includes.py reads every source's #include lines against it (also a bazel test:
#    //tools:check_includes_test);
#  - `check_includes.py --bazel-rules` writes it as one rule a package: the packages it must not
#    depend on directly (all but its own, base/ and those it may include). Each is checked with
#    `bazel query`, so a BUILD dep without an include is caught too. Direct edges suffice: every
#    package with a limit is checked, so no path can leave a package's layer through another.
# Prints each violation with the offending targets; exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
python3 tools/check_includes.py || failed=1

# "name|packages|forbidden dependencies"
mapfile -t rules < <(python3 tools/check_includes.py --bazel-rules)
if [ ${#rules[@]} -eq 0 ]; then
  echo "layering: tools/check_includes.py --bazel-rules gave no rules" >&2
  exit 1
fi

for rule in "${rules[@]}"; do
  IFS='|' read -r name from forbidden <<<"$rule"
  # Targets of `from` with a direct dependency on a forbidden target: the edges to fix.
  offenders=$(bazel query --noshow_progress \
    "($from) intersect rdeps($from, ($forbidden) except ($from), 1)" 2>/dev/null || echo "query failed")
  if [ -n "$offenders" ]; then
    echo "layering: $name; offending targets:" >&2
    echo "$offenders" | sed 's/^/  /' >&2
    failed=1
  fi
done
[ $failed -eq 0 ] && echo "layering: every package keeps to its layer (${#rules[@]} dependency rules)"
exit $failed
