#!/usr/bin/env python3
"""Checks the `#include "..."` lines of every source file against the package table of
docs/ARCHITECTURE.md: a file of package P may include only P's own headers, the packages P may
include (ALLOWED below) and third-party headers. tools/check_layering.sh checks the same layering
on the Bazel dependency graph; this reads the sources, so it needs no bazel query and runs as a
test (//tools:check_includes_test).

Usage: check_includes.py [ROOT]   (ROOT: the source tree, default: this file's repository)
Prints each violation as `file:line: package may not include "header"` and exits 1 if any.
       check_includes.py --bazel-rules
Prints the table as tools/check_layering.sh's Bazel dependency rules, one a line:
`name|packages|forbidden dependencies` (see bazel_rules).
"""
import os
import re
import sys

BELOW_TIERS = {"cluster", "moe", "model", "kernels", "proto", "tokenizer"}
TIERS = {"attention_nodes", "router", "expert_nodes"}

# The one rule table: package -> the project packages its files may include (None: any), besides
# base/, which every package may include. docs/ARCHITECTURE.md ("Packages and what they may
# include") describes the same table in words.
ALLOWED = {
    "base": set(),
    "kernels": set(),
    "proto": set(),
    "model": {"kernels"},
    "cluster": {"proto"},
    "tokenizer": set(),
    "moe": {"model", "kernels", "proto"},
    "attention_nodes": BELOW_TIERS,
    "router": BELOW_TIERS,
    "expert_nodes": BELOW_TIERS,
    "http_front": {"cluster", "tokenizer", "proto"},
    "coordinator": {"cluster", "moe", "model", "proto"},
    "engine": TIERS | BELOW_TIERS,
    "reference": {"model"},
    "launcher": None,
    "tools": None,
    "tests": None,
    "bench": None,
}

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def violations(root):
    """Yields (path, line number, package, header) for each forbidden include under root."""
    for package, allowed in sorted(ALLOWED.items()):
        if allowed is None:
            continue
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        header = match.group(1)
                        target = header.split("/", 1)[0]
                        if "/" not in header or target not in ALLOWED or target == package:
                            continue  # third-party, same directory or own package
                        if target == "base" or target in allowed:
                            continue
                        yield rel, number, package, header


def bazel_rules():
    """The same table as Bazel dependency rules for tools/check_layering.sh: for each package P
    with a limit, (name, "//P/...", forbidden) where forbidden names, as a `bazel query`
    expression, every project package P may not depend on directly: all but P, base/ and the
    packages P may include, and the root package (//:k3serve)."""
    rules = []
    for package, allowed in sorted(ALLOWED.items()):
        if allowed is None:
            continue
        forbidden = [f"//{other}/..." for other in sorted(ALLOWED)
                     if other not in allowed | {package, "base"}]
        forbidden.append("//:all")
        may = ", ".join(f"{p}/" for p in sorted(allowed | {"base"}))
        rules.append((f"{package}/ may depend only on {may}", f"//{package}/...",
                      " + ".join(forbidden)))
    return rules


def main(argv):
    if argv[1:] == ["--bazel-rules"]:
        for rule in bazel_rules():
            print("|".join(rule))
        return 0
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.realpath(root)
    missing = [p for p in ALLOWED if not os.path.isdir(os.path.join(root, p))]
    if missing:
        print(f"includes: {root} is not the source tree (no {', '.join(missing)})", file=sys.stderr)
        return 2
    found = list(violations(root))
    for rel, number, package, header in found:
        print(f'{rel}:{number}: {package}/ may not include "{header}"', file=sys.stderr)
    if found:
        return 1
    print(f"includes: every package keeps to its layer ({len(ALLOWED)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
