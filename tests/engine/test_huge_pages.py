"""The weights' huge pages: which mappings are found, and that the kernel really backs them.

What the kernel does depends on its THP mode and version, so the test states the behaviour
expected for the machine it runs on (read from /sys and uname), rather than skipping.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve.engine import huge_pages
from ortserve.engine.config import EngineConfig
from ortserve.engine.core import EngineCore
from ortserve.engine.huge_pages import HUGE_PAGE, PAGE, Mapping

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def kernel_at_least(major: int, minor: int) -> bool:
    return tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (major, minor)


def resident_pages(array: np.ndarray) -> int:
    """How many of the 4 KiB pages under ``array`` are resident (mincore)."""
    libc = huge_pages._Libc()
    start = array.ctypes.data // PAGE * PAGE
    length = array.ctypes.data + array.nbytes - start
    flags = np.zeros(-(-length // PAGE), np.uint8)
    assert libc.mincore(start, length, flags.ctypes.data) == 0
    return int((flags & 1).sum())


def test_populate_commits_every_page_at_once():
    """A fresh anonymous mapping (what np.zeros gets for a large array in a new process) is lazy;
    populate faults it all in (Linux 5.14+), as the runner does for the KV cache so that no decode
    step pays for a block's first write. (np.zeros itself may reuse freed, resident heap memory in
    a long-lived process, so the test maps its own.)"""
    mapping = mmap.mmap(-1, 64 << 20)
    array = np.frombuffer(mapping, np.float32)
    pages = -(-array.nbytes // PAGE)
    assert resident_pages(array) < pages // 2  # lazy until written
    populated = huge_pages.populate([array])
    assert populated == kernel_at_least(5, 14)
    if populated:
        assert resident_pages(array) >= pages - 1  # the first page may be shared with other data
        assert not array.any()  # still zeros


def collapse_expected() -> bool:
    """MADV_COLLAPSE exists from Linux 6.1 and works unless THP is switched off."""
    if not THP_MODE.exists():
        return False
    mode = re.search(r"\[(\w+)\]", THP_MODE.read_text())
    return mode is not None and mode.group(1) != "never" and kernel_at_least(6, 1)


def test_aligned_keeps_only_whole_huge_pages():
    assert Mapping(HUGE_PAGE + 1, 4 * HUGE_PAGE - 1).aligned == (2 * HUGE_PAGE, HUGE_PAGE)
    assert Mapping(HUGE_PAGE, 3 * HUGE_PAGE).aligned == (HUGE_PAGE, 2 * HUGE_PAGE)
    assert Mapping(HUGE_PAGE + 1, 2 * HUGE_PAGE + 5).aligned[1] == 0


# Run in a fresh process, as the engine process builds its session, so that the memory it held
# before is known. With "after_a_large_free", glibc has first raised its mmap threshold (a freed
# 31 MiB block) and holds 128 MiB of free heap, as after an export on first use: there the weights
# come from the heap, in no new mapping (found only since the heap's in-use pages are collapsed).
# Below them 64 MiB of freed holes alternate with 64 MiB in use, which must stay holes (the
# process's Rss must not grow by them).
SESSION_IN_A_FRESH_PROCESS = """
import ctypes, json, sys
import numpy as np
import onnxruntime as ort
from ortserve.engine import huge_pages

def rollup(field):
    lines = open("/proc/self/smaps_rollup").read().splitlines()
    return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

def anon_huge_bytes():
    return rollup("AnonHugePages")

def rss_bytes():
    return rollup("Rss")

if sys.argv[3] == "after_a_large_free":
    big = np.ones(31 << 20, np.uint8)
    del big
    pairs = [(np.ones(1 << 20, np.uint8), np.ones(1 << 20, np.uint8)) for _ in range(64)]
    kept = [b for a, b in pairs]  # every other MiB stays in use: huge pages half free
    del pairs
    blocks = [np.ones(16 << 20, np.uint8) for _ in range(8)]
    pin = np.ones(1 << 20, np.uint8)  # above them, so the freed heap is not trimmed
    del blocks
    ctypes.CDLL(None).malloc_trim(0)  # as the runner does first: freed huge pages leave the count here
huge_before, rss_before = anon_huge_bytes(), rss_bytes()
with huge_pages.weights_on_huge_pages() as report:
    session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.load(sys.argv[2])
print(json.dumps({
    "in_use": report.in_use_bytes,
    "collapsed": report.collapsed_bytes,
    "huge_gained": anon_huge_bytes() - huge_before,
    "rss_gained": rss_bytes() - rss_before,
    "y": session.run(None, {"x": x})[0].tolist(),
}))
"""


@pytest.mark.parametrize("before", ["fresh", "after_a_large_free"])
def test_a_sessions_prepacked_weights_are_collapsed_into_huge_pages(tmp_path, before):
    """onnxruntime copies a MatMul's weight into its own packed buffer while the session is
    built; that buffer is what decode streams, and what the runner collapses."""
    weight = np.random.default_rng(0).standard_normal((1024, 4096), np.float32)  # 16 MiB
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((1, 1024), np.float32)
    np.save(tmp_path / "x.npy", x)
    script = [SESSION_IN_A_FRESH_PROCESS, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), before]
    run = subprocess.run([sys.executable, "-c", *script], capture_output=True, text=True, check=True)
    result = json.loads(run.stdout.splitlines()[-1])
    whole_pages = weight.nbytes - 2 * HUGE_PAGE  # its unaligned ends may not fill a huge page
    assert result["in_use"] >= whole_pages
    assert result["rss_gained"] < 64 << 20  # the weight, its packed copy, and no freed heap filled
    if collapse_expected():
        assert result["collapsed"] >= whole_pages
        assert result["huge_gained"] >= whole_pages
    else:
        assert result["collapsed"] == 0
    np.testing.assert_allclose(np.array(result["y"], np.float32), x @ weight, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_an_engines_kv_cache_is_committed_when_it_starts(smollm2_artifact):
    """The block pool hands out its least recently used block, so a fresh server would write to
    never-touched pages for as long as it takes to walk the pool: the runner commits it at start."""
    engine = EngineCore(EngineConfig(model=str(smollm2_artifact), kv_cache_space=0.25))
    for cache in (engine.runner.kv_caches[0], engine.runner.kv_caches[-1]):
        pages = -(-cache.nbytes // PAGE)
        assert (resident_pages(cache) >= pages - 1) == kernel_at_least(5, 14)
