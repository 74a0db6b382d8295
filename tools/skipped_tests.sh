#!/usr/bin/env bash
# Lists the test cases of the last `bazel test` that skipped themselves (GTEST_SKIP) and why.
# Bazel 4 reports a test binary whose cases all skipped as PASSED; this makes the skips visible.
# Usage: tools/skipped_tests.sh [TESTLOGS_DIR]  (default: bazel info bazel-testlogs). Prints nothing
# when none skipped. Exits 0 either way.
set -euo pipefail
cd "$(dirname "$0")/.."

logs=${1:-$(bazel info bazel-testlogs 2>/dev/null)} || exit 0
[ -d "$logs" ] || exit 0
find -L "$logs" -name test.xml -print0 2>/dev/null | sort -z | while IFS= read -r -d '' xml; do
  grep -q 'result="skipped"' "$xml" || continue
  target=${xml#"$logs"/}
  target=${target%/test.xml}
  target=$(sed -E 's#/(run|shard)_[0-9]+_of_[0-9]+##g' <<<"$target")  # --runs_per_test, sharding
  package=${target%/*}
  # gtest writes <testcase name="Case" ... result="skipped" ... classname="Suite"> then
  # <skipped message="file:line&#x0A;reason">.
  grep -o '<testcase name="[^"]*"[^>]*result="skipped"[^>]*classname="[^"]*"\|<skipped message="[^"]*"' \
      "$xml" | sed -e 's/^<testcase name="\([^"]*\)".*classname="\([^"]*\)"$/\2.\1/' \
                   -e 's/^<skipped message="\(.*\)"$/\1/' -e 's/&#x0A;/ /g' -e 's/&quot;/"/g' \
                   -e "s/&apos;/'/g" -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&amp;/\&/g' |
    paste -d' ' - - | while IFS= read -r line; do
      echo "SKIPPED //${package}:${target##*/} ${line}"
    done
done
