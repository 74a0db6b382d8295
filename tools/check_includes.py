#!/usr/bin/env python3
"""Checks the `#include "..."` lines of every source file against the package table of
docs/ARCHITECTURE.md: a file of package P may include only P's own headers, the packages P may
include (ALLOWED below) and third-party headers. Inside a package whose sub-folders are rooms
(ROOMS below: attention_nodes/), a file of room R may include only R's own headers and the rooms
R may include; the package's own folder holds no sources, and every sub-folder is a room. tools/check_layering.sh checks the same layering
on the Bazel dependency graph; this reads the sources, so it needs no bazel query and runs as a
test (//tools:check_includes_test).

Usage: check_includes.py [ROOT]   (ROOT: the source tree, default: this file's repository)
Prints each violation as `file:line: package may not include "header"` (or, for a room,
`file:line: package/room/ may not include "header"`), each source outside a room as
`file: package/ holds only its rooms (...)`, and exits 1 if any.
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

# Packages made of rooms: package -> {room (a sub-folder) -> the rooms of the same package its files
# may include}. It must stay a DAG; docs/ARCHITECTURE.md ("The rooms of attention_nodes/") draws
# it, and each room's BUILD visibility admits the same rooms. A room may include the packages its
# package may include (ALLOWED); packages outside may include any room, as ALLOWED says.
ROOMS = {
    "attention_nodes": {
        "forward": set(),                 # CPU forward pass and the StepRunner seam
        "moe_client": set(),              # the worker's side of the MoE hops
        "cuda": {"forward", "moe_client"},  # GPU forward pass behind the same seam
        "scheduler": {"forward"},         # GenerationScheduler, batching, prefix cache
        "server": {"forward", "moe_client", "cuda", "scheduler"},  # the worker and its API
    },
}

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def _includes(path):
    """Yields (line number, header) for each `#include "header"` line of the file at path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            match = INCLUDE.match(line)
            if match:
                yield number, match.group(1)


def _sources(root, package):
    """Yields (path relative to root, path) for each source file under root/package, sorted."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root), path


def _room(package, rel):
    """The room of package that the file or header rel (relative to the root) lies in; "" for one
    directly in the package's folder."""
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == package else ""


def violations(root):
    """Yields (path, line number, package or package/room/, header) for each forbidden include
    under root."""
    for package, allowed in sorted(ALLOWED.items()):
        if allowed is None:
            continue
        rooms = ROOMS.get(package)
        for rel, path in _sources(root, package):
            for number, header in _includes(path):
                target = header.split("/", 1)[0]
                if "/" not in header or target not in ALLOWED:
                    continue  # third-party or same directory
                if target == package:
                    if rooms is None:
                        continue  # own package
                    room, header_room = _room(package, rel), _room(package, header)
                    if header_room and (header_room == room
                                        or header_room in rooms.get(room, set())):
                        continue  # own room or a room it may include
                    yield rel, number, f"{package}/{room}/" if room else package, header
                    continue
                if target == "base" or target in allowed:
                    continue
                yield rel, number, package, header


def strays(root):
    """Yields (path, why) for each source of a package with rooms that lies outside its rooms:
    directly in the package's folder, or in a sub-folder ROOMS does not name."""
    for package, rooms in sorted(ROOMS.items()):
        for rel, _ in _sources(root, package):
            room = _room(package, rel)
            if not room:
                yield rel, f"{package}/ holds only its rooms ({', '.join(sorted(rooms))})"
            elif room not in rooms:
                yield rel, f"{package}/{room}/ is not a room of ROOMS in tools/check_includes.py"


def bazel_rules():
    """The same tables as Bazel dependency rules for tools/check_layering.sh: for each package P
    with a limit, (name, "//P/...", forbidden) where forbidden names, as a `bazel query`
    expression, every project package P may not depend on directly: all but P, base/ and the
    packages P may include, and the root package (//:k3serve); and for each room R of P,
    (name, "//P/R/...", the rooms of P that R may not depend on)."""
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
    for package, rooms in sorted(ROOMS.items()):
        for room, may_rooms in sorted(rooms.items()):
            forbidden = [f"//{package}/{other}/..." for other in sorted(rooms)
                         if other not in may_rooms | {room}]
            if not forbidden:
                continue
            may = ", ".join(f"{package}/{r}/" for r in sorted(may_rooms)) or "itself"
            rules.append((f"{package}/{room}/ may depend only on {may} among {package}/'s rooms",
                          f"//{package}/{room}/...", " + ".join(forbidden)))
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
        print(f'{rel}:{number}: {package.rstrip("/")}/ may not include "{header}"', file=sys.stderr)
    stray = list(strays(root))
    for rel, why in stray:
        print(f"{rel}: {why}", file=sys.stderr)
    if found or stray:
        return 1
    rooms = sum(len(r) for r in ROOMS.values())
    print(f"includes: every package keeps to its layer ({len(ALLOWED)} packages, {rooms} rooms)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
