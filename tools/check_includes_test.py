#!/usr/bin/env python3
"""tools/check_includes.py on a copy of the source tree: it passes as the tree is, and fails on a
planted include of each forbidden kind (one scratch file at a time), naming that file."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_includes  # noqa: E402

# The source tree: the runfiles under `bazel test`, the repository when run by hand.
SOURCE_ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (scratch file, include that the package table forbids there)
PLANTED = [
    ("moe/planted.h", "cluster/actor.h"),
    ("moe/planted.cc", "cluster/span_log.h"),
    ("model/planted2.cc", "tokenizer/random_tokenizer.h"),  # a known breach's header, elsewhere
    ("base/planted.h", "cluster/actor.h"),
    ("moe/planted2.h", "router/router_core.h"),
    ("model/planted.cc", "tokenizer/tokenizer.h"),
    ("model/planted.h", "cluster/actor.h"),
    ("reference/planted.cc", "kernels/bf16.h"),
    ("kernels/planted.h", "model/config.h"),
    ("cluster/planted.h", "moe/routed_moe.h"),
    ("tokenizer/planted.cc", "cluster/actor.h"),
    ("attention_nodes/planted.cc", "router/router_core.h"),
    ("router/planted.cc", "expert_nodes/expert_worker.h"),
    ("expert_nodes/planted.cc", "attention_nodes/kda.h"),
    ("attention_nodes/planted.h", "engine/local_engine.h"),
    ("http_front/planted.cc", "moe/routed_moe.h"),
    ("coordinator/planted.cc", "router/router_core.h"),
    ("engine/planted.cc", "launcher/local_cluster.h"),
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
        # Not vacuous: the copy holds the packages' sources.
        self.assertTrue(os.path.exists(os.path.join(self.root, "moe", "routed_moe.h")))

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

    def test_allowed_includes_pass(self):
        path = os.path.join(self.root, "moe", "planted.h")
        with open(path, "w") as f:
            f.write('#include "model/config.h"\n#include "kernels/bf16.h"\n#include "moe/x.h"\n'
                    '#include "base/trace_context.h"\n')
        self.assertEqual(list(check_includes.violations(self.root)), [])
        self.assertEqual(check_includes.main(["check_includes", self.root]), 0)


if __name__ == "__main__":
    unittest.main()
