#!/usr/bin/env bash
# Summarises a `bazel test` run from its console output (file $1): how many test targets passed,
# failed and were skipped (incompatible with this machine), and which test cases inside passing
# targets skipped themselves (GTEST_SKIP: no GPU, no root, no network namespaces...), with their
# reasons from the targets' test.xml. Bazel alone reports such a target as PASSED.
set -euo pipefail
log=$1
testlogs=$(bazel info bazel-testlogs 2>/dev/null)

passed=0 failed=0 skipped=0
skipped_cases=()
while read -r target status; do
  case $status in
    PASSED|FLAKY)
      passed=$((passed + 1))
      xml="$testlogs/${target#//}"
      xml="${xml/://}/test.xml"
      if [ -f "$xml" ]; then
        # One line per skipped case: "Suite.Case: message".
        while IFS= read -r line; do
          [ -n "$line" ] && skipped_cases+=("$target $line")
        done < <(tr -d '\n' <"$xml" | grep -o '<testcase [^>]*result="skipped"[^>]*>[^<]*<skipped message="[^"]*"' |
                 sed -E 's/.*name="([^"]*)".*classname="([^"]*)".*message="([^"]*)"/\2.\1: \3/' || true)
      fi
      ;;
    SKIPPED) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done < <(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|SKIPPED|INCOMPLETE).*/\1 \3/p' "$log" |
         sed -E 's/ (FAILED TO BUILD|NO STATUS)$/ FAILED/')

echo "tests: $passed passed, $failed failed, $skipped skipped (not buildable here), ${#skipped_cases[@]} test cases skipped themselves"
for c in "${skipped_cases[@]}"; do
  c=${c//&#x0A;/ - }
  c=${c//&apos;/\'}
  c=${c//&quot;/\"}
  echo "  skipped: ${c//&amp;/\&}"
done
