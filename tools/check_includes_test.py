#!/usr/bin/env python3
"""tools/check_includes.py on a copy of the source tree: it passes as the tree is, and fails on a
planted include of each forbidden kind (one scratch file at a time), naming that file."""
import io
import os
import shutil
import sys
import tempfile
import unittest
import unittest.mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_includes  # noqa: E402

# The source tree: the runfiles under `bazel test`, the repository when run by hand.
SOURCE_ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (scratch file, include that the package table forbids there)
PLANTED = [
    ("moe/planted.h", "cluster/actor.h"),
    ("moe/planted.cc", "cluster/span_log.h"),
    ("model/planted2.cc", "tokenizer/random_tokenizer.h"),  # what model/ once wrote checkpoints with
    ("base/planted.h", "cluster/actor.h"),
    ("moe/planted2.h", "router/router_core.h"),
    ("model/planted.cc", "tokenizer/tokenizer.h"),
    ("model/planted.h", "cluster/actor.h"),
    ("reference/planted.cc", "kernels/bf16.h"),
    ("kernels/planted.h", "model/config.h"),
    ("cluster/planted.h", "moe/routed_moe.h"),
    ("tokenizer/planted.cc", "cluster/actor.h"),
    ("attention_nodes/server/planted.cc", "router/router_core.h"),
    ("router/planted.cc", "expert_nodes/expert_worker.h"),
    ("expert_nodes/planted.cc", "attention_nodes/forward/kda.h"),
    ("attention_nodes/forward/planted.h", "engine/local_engine.h"),
    ("http_front/planted.cc", "moe/routed_moe.h"),
    ("coordinator/planted.cc", "router/router_core.h"),
    ("engine/planted.cc", "launcher/local_cluster.h"),
    # The rooms of attention_nodes/ (check_includes.ROOMS): a room up into its parent's folder,
    # the parent's folder into a room, and each room into one it may not include.
    ("attention_nodes/cuda/planted.h", "attention_nodes/step_runner.h"),
    ("attention_nodes/forward/planted.cc", "attention_nodes/planted.h"),
    ("attention_nodes/cuda/planted.cc", "attention_nodes/scheduler/generation_scheduler.h"),
    ("attention_nodes/cuda/planted2.cc", "attention_nodes/server/device_step_runner.h"),
    ("attention_nodes/forward/planted2.h", "attention_nodes/cuda/gpu_step_runner.h"),
    ("attention_nodes/forward/planted3.h", "attention_nodes/moe_client/remote_routed_moe.h"),
    ("attention_nodes/forward/planted4.h", "attention_nodes/scheduler/prefix_cache.h"),
    ("attention_nodes/moe_client/planted.cc", "attention_nodes/forward/step_runner.h"),
    ("attention_nodes/scheduler/planted.cc", "attention_nodes/cuda/gpu_step_runner.h"),
    ("attention_nodes/scheduler/planted2.h", "attention_nodes/moe_client/remote_routed_moe.h"),
    ("attention_nodes/scheduler/planted3.h", "attention_nodes/server/attention_server.h"),
]

# (scratch file, include that the room table allows there)
ALLOWED_IN_ROOMS = [
    ("attention_nodes/cuda/planted.h", "attention_nodes/forward/step_runner.h"),
    ("attention_nodes/cuda/planted.cc", "attention_nodes/moe_client/remote_device_experts.h"),
    ("attention_nodes/scheduler/planted.h", "attention_nodes/forward/model_runner.h"),
    ("attention_nodes/server/planted.cc", "attention_nodes/cuda/gpu_step_runner.h"),
    ("attention_nodes/server/planted.h", "attention_nodes/scheduler/generation_scheduler.h"),
    ("engine/planted.cc", "attention_nodes/cuda/gpu_model_runner.h"),
    ("tools/planted.cc", "attention_nodes/forward/kda.h"),
]


class CheckIncludesTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        for package in check_includes.ALLOWED:
            source = os.path.join(SOURCE_ROOT, package)
            if os.path.isdir(source):
                shutil.copytree(source, os.path.join(self.root, package),
                                ignore=shutil.ignore_patterns("bazel-*"))
            else:
                os.makedirs(os.path.join(self.root, package))

    def tearDown(self):
        shutil.rmtree(self.root)

    def test_tree_as_it_is_passes(self):
        self.assertEqual(list(check_includes.violations(self.root)), [])
        self.assertEqual(list(check_includes.strays(self.root)), [])
        # Not vacuous: the copy holds the packages' sources, each room's among them.
        self.assertTrue(os.path.exists(os.path.join(self.root, "moe", "routed_moe.h")))
        for room in check_includes.ROOMS["attention_nodes"]:
            folder = os.path.join(self.root, "attention_nodes", room)
            self.assertTrue(any(n.endswith(".h") for n in os.listdir(folder)), room)

    def test_each_planted_include_fails(self):
        for scratch, header in PLANTED:
            with self.subTest(scratch=scratch, header=header):
                path = os.path.join(self.root, scratch)
                with open(path, "w") as f:
                    f.write(f'// planted\n#include "absl/status/status.h"\n#include "{header}"\n')
                try:
                    found = list(check_includes.violations(self.root))
                    self.assertEqual([(v[0], v[1], v[3]) for v in found], [(scratch, 3, header)])
                    self.assertEqual(check_includes.main(["check_includes", self.root]), 1)
                finally:
                    os.remove(path)

    def test_includes_the_room_table_allows_pass(self):
        for scratch, header in ALLOWED_IN_ROOMS:
            with self.subTest(scratch=scratch, header=header):
                path = os.path.join(self.root, scratch)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(f'#include "{header}"\n')
                try:
                    self.assertEqual(list(check_includes.violations(self.root)), [])
                finally:
                    os.remove(path)

    def test_a_source_outside_the_rooms_fails(self):
        for scratch in ("attention_nodes/planted.cc", "attention_nodes/lobby/planted.h"):
            with self.subTest(scratch=scratch):
                path = os.path.join(self.root, scratch)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write('#include "absl/status/status.h"\n')
                try:
                    self.assertEqual([rel for rel, _ in check_includes.strays(self.root)],
                                     [scratch])
                    self.assertEqual(list(check_includes.violations(self.root)), [])
                    self.assertEqual(check_includes.main(["check_includes", self.root]), 1)
                finally:
                    os.remove(path)

    def test_allowed_includes_pass(self):
        path = os.path.join(self.root, "moe", "planted.h")
        with open(path, "w") as f:
            f.write('#include "model/config.h"\n#include "kernels/bf16.h"\n#include "moe/x.h"\n'
                    '#include "base/trace_context.h"\n')
        self.assertEqual(list(check_includes.violations(self.root)), [])
        self.assertEqual(check_includes.main(["check_includes", self.root]), 0)


class RoomTableTest(unittest.TestCase):
    def test_rooms_include_only_rooms_of_their_package_without_a_cycle(self):
        for package, rooms in check_includes.ROOMS.items():
            self.assertIn(package, check_includes.ALLOWED)
            done = set()
            while len(done) < len(rooms):
                ready = [r for r, may in rooms.items() if r not in done and may <= done]
                self.assertTrue(ready, f"{package}: a cycle among {set(rooms) - done}")
                done.update(ready)


class BazelRulesTest(unittest.TestCase):
    """The table as tools/check_layering.sh's dependency rules, against the package table of
    docs/ARCHITECTURE.md written out here by hand."""

    def setUp(self):
        self.rules = {packages: forbidden.split(" + ")
                      for _, packages, forbidden in check_includes.bazel_rules()}

    def test_packages_without_a_limit_have_no_rule(self):
        for package in ("launcher", "tools", "tests", "bench"):
            self.assertNotIn(f"//{package}/...", self.rules)
        self.assertIn("//base/...", self.rules)
        self.assertIn("//proto/...", self.rules)

    def test_a_package_may_depend_on_what_it_may_include_and_nothing_else(self):
        moe = self.rules["//moe/..."]
        for forbidden in ("//cluster/...", "//tokenizer/...", "//router/...", "//coordinator/...",
                          "//launcher/...", "//tests/...", "//:all"):
            self.assertIn(forbidden, moe)
        for allowed in ("//model/...", "//kernels/...", "//proto/...", "//base/...", "//moe/..."):
            self.assertNotIn(allowed, moe)
        http_front = self.rules["//http_front/..."]
        self.assertIn("//model/...", http_front)
        self.assertNotIn("//tokenizer/...", http_front)
        base = self.rules["//base/..."]
        self.assertIn("//proto/...", base)
        self.assertNotIn("//base/...", base)

    def test_model_may_not_depend_on_the_tokenizer(self):
        # model/ once wrote tokenizers with its random checkpoints (tools/random_model_folder now).
        model = self.rules["//model/..."]
        self.assertIn("//tokenizer/...", model)
        self.assertIn("//cluster/...", model)
        self.assertNotIn("//kernels/...", model)

    def test_the_command_line_writes_one_rule_a_line(self):
        with unittest.mock.patch("sys.stdout", new_callable=io.StringIO) as out:
            self.assertEqual(check_includes.main(["check_includes", "--bazel-rules"]), 0)
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), len(self.rules))
        for line in lines:
            name, packages, forbidden = line.split("|")
            self.assertIn(packages, self.rules)
            self.assertTrue(name.startswith(packages[2:-4] + "/ may depend only on"), name)

    def test_a_room_may_depend_on_the_rooms_it_may_include_and_no_other(self):
        cuda = self.rules["//attention_nodes/cuda/..."]
        self.assertEqual(sorted(cuda), ["//attention_nodes/scheduler/...",
                                        "//attention_nodes/server/..."])
        forward = self.rules["//attention_nodes/forward/..."]
        for room in ("cuda", "moe_client", "scheduler", "server"):
            self.assertIn(f"//attention_nodes/{room}/...", forward)
        scheduler = self.rules["//attention_nodes/scheduler/..."]
        self.assertNotIn("//attention_nodes/forward/...", scheduler)
        self.assertIn("//attention_nodes/cuda/...", scheduler)
        # server/ may depend on every room, so it has no room rule.
        self.assertNotIn("//attention_nodes/server/...", self.rules)


if __name__ == "__main__":
    unittest.main()
