#!/usr/bin/env bash
# Runs tools/check_includes_test.py (the planted-include test) under `bazel test`.
exec python3 tools/check_includes_test.py
