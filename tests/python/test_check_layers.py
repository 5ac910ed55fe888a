#!/usr/bin/env python3
"""scripts/check_layers.py on a three-layer tree (core < nn < runtime, cli on top): the clean tree passes, and each
planted violation fails naming the file, the line and both layers. Standard library only:
python3 tests/python/test_check_layers.py
"""
import os
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import check_layers  # noqa: E402

TREE = {
    "CMakeLists.txt": "set(DSCPP_LAYERS core nn runtime)\n",
    "src/core/CMakeLists.txt": "dscpp_layer(core)\n",
    "src/nn/CMakeLists.txt": "dscpp_layer(nn DEPS core)\n",
    "src/runtime/CMakeLists.txt": "dscpp_layer(runtime DEPS core nn)\ntarget_link_libraries(dscpp_runtime PUBLIC x)\n",
    "include/dscpp/core/tensor.h": "#pragma once\n#include <vector>\n",
    "src/core/cuda/runtime.cuh": '#include "dscpp/core/tensor.h"\n',
    "src/core/tensor.cpp": '#include "dscpp/core/tensor.h"\n#include "cuda/runtime.cuh"\n',
    "include/dscpp/nn/linear.h": '#include "dscpp/core/tensor.h"\n',
    "src/nn/impl.h": "#pragma once\n",
    "src/nn/linear.cpp": '#include "dscpp/nn/linear.h"\n#include "impl.h"\n#include "core/cuda/runtime.cuh"\n',
    "include/dscpp/runtime/engine.h": '#include "dscpp/nn/linear.h"\n',
    "src/runtime/engine.cpp": '#include "dscpp/runtime/engine.h"\n',
    "cli/main.cpp": '#include "dscpp/runtime/engine.h"\n#include "cli/commands.h"\n',
    "cli/commands.h": "#pragma once\n",
}


class CheckLayers(unittest.TestCase):
    def run_on(self, changes):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d).resolve()
            for path, text in {**TREE, **changes}.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
            return check_layers.check(root)

    def test_clean_tree_passes(self):
        order, errors = self.run_on({})
        self.assertEqual(order, ["core", "nn", "runtime", "cli"])
        self.assertEqual(errors, [])

    def test_upward_include_fails_naming_file_line_and_layers(self):
        _, errors = self.run_on({"src/nn/linear.cpp": '#include "dscpp/nn/linear.h"\n#include "dscpp/runtime/engine.h"\n'})
        self.assertEqual(errors, ["src/nn/linear.cpp:2: nn includes dscpp/runtime/engine.h of runtime, a layer above it"])

    def test_public_header_including_the_app_fails(self):
        _, errors = self.run_on({"include/dscpp/core/tensor.h": '#include "cli/commands.h"\n'})
        self.assertEqual(errors, ["include/dscpp/core/tensor.h:1: core includes cli/commands.h of cli, a layer above it"])

    def test_private_header_of_another_layer_fails(self):
        _, errors = self.run_on({"src/runtime/engine.cpp": '#include "nn/impl.h"\n'})
        self.assertEqual(errors, ["src/runtime/engine.cpp:1: runtime includes src/nn/impl.h, private to nn"])
        _, errors = self.run_on({"cli/main.cpp": '#include "../src/nn/impl.h"\n'})
        self.assertEqual(errors, ["cli/main.cpp:1: cli includes src/nn/impl.h, private to nn"])
        _, errors = self.run_on({"include/dscpp/nn/linear.h": '#include "../../../src/core/cuda/runtime.cuh"\n'})
        self.assertEqual(errors, ["include/dscpp/nn/linear.h:1: public header of nn includes src/core/cuda/runtime.cuh, "
                                  "private to core"])

    def test_upward_link_and_unknown_folder_fail(self):
        _, errors = self.run_on({"src/nn/CMakeLists.txt": "dscpp_layer(nn DEPS core runtime)\n"})
        self.assertEqual(errors, ["src/nn/CMakeLists.txt: dscpp_layer(nn) in nn's folder depends on runtime, "
                                  "not a layer below nn"])
        _, errors = self.run_on({"src/core/CMakeLists.txt": "dscpp_layer(core)\n"
                                 "target_link_libraries(dscpp_core PRIVATE dscpp_nn)  # dscpp_runtime\n"})
        self.assertEqual(errors, ["src/core/CMakeLists.txt:2: core links dscpp_nn, not a layer below it"])
        _, errors = self.run_on({"src/extra/x.cpp": "\n"})
        self.assertEqual(errors, ["src/extra: folder is not a layer (add it to DSCPP_LAYERS in CMakeLists.txt)"])

    def test_autotune_sits_above_runtime_and_launcher(self):
        layers = {"src/launcher/CMakeLists.txt": "dscpp_layer(launcher DEPS core)\n",
                  "src/autotune/CMakeLists.txt": "dscpp_layer(autotune DEPS core)\n"}
        _, errors = self.run_on({**layers, "CMakeLists.txt": "set(DSCPP_LAYERS core nn runtime launcher autotune)\n"})
        self.assertEqual(errors, [])
        _, errors = self.run_on({**layers, "CMakeLists.txt": "set(DSCPP_LAYERS core nn autotune runtime launcher)\n"})
        self.assertEqual(errors, ["CMakeLists.txt: DSCPP_LAYERS puts autotune below runtime; it must sit above runtime",
                                  "CMakeLists.txt: DSCPP_LAYERS puts autotune below launcher; it must sit above launcher"])


if __name__ == "__main__":
    unittest.main()
