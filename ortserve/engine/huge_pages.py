"""Back the weights with 2 MiB transparent huge pages (Linux).

Decode reads every weight once per token, so its speed is the speed of one long streaming read.
With 4 KiB pages that read is slower than the memory allows: the hardware prefetchers stop at
every 4 KiB page boundary and each page costs a TLB walk. On a Sapphire Rapids Xeon,
``benchmarks/membw.py``'s read kernel reaches 30 GB/s on 2 threads with huge pages and 22-23 GB/s
without (``benchmarks/tables/fp32_roofline.md`` has what it does to decode).

Most distributions ship transparent huge pages in ``madvise`` mode, so nothing gets them unless it
asks. The weights that decode reads are allocated while the session is built: onnxruntime's
prepacked fp32 MatMul weights, and ``MatMulQ``'s copy of its codes and scales (onnxruntime itself
hands them over as views of the data file's mapping, whose page-cache pages stay at 4 KiB). So the
runner notes the anonymous mappings before, and afterwards asks the kernel to collapse the new ones
into huge pages at once (``MADV_COLLAPSE``, Linux 6.1+), or, on older kernels, marks them for the
background collapser (``MADV_HUGEPAGE``). Memory that malloc hands out again from what the process
already held shows as no new mapping and is missed; the engine process builds its session first
thing, so there the weights are new mappings. The KV cache needs nothing: numpy already asks for huge
pages for its own arrays of 4 MiB or more. Every call is advice: where the kernel refuses (THP
``never``, another OS), nothing changes but the speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
MAPS = Path("/proc/self/maps")


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int

    @property
    def aligned(self) -> tuple[int, int]:
        """The whole huge pages inside this mapping: (start, length), length 0 if none."""
        start = -(-self.start // HUGE_PAGE) * HUGE_PAGE
        return start, max(0, (self.end // HUGE_PAGE) * HUGE_PAGE - start)


def anonymous_mappings() -> frozenset[Mapping]:
    """This process's private, writable, anonymous mappings (and the heap) of at least one huge page."""
    if not MAPS.exists():
        return frozenset()
    found = set()
    for line in MAPS.read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        path = fields[5] if len(fields) > 5 else ""
        if fields[1].startswith("rw") and path in ("", "[heap]") and end - start >= HUGE_PAGE:
            found.add(Mapping(start, end))
    return frozenset(found)


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise(addr, length, advice), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    madvise: Callable[[int, int, int], int] = libc.madvise
    return madvise


def collapse(mappings: frozenset[Mapping]) -> int:
    """Ask for huge pages under ``mappings`` now; returns the bytes the kernel collapsed."""
    madvise = _madvise()
    if madvise is None:
        return 0
    collapsed = 0
    for mapping in sorted(mappings, key=lambda m: m.start):
        start, length = mapping.aligned
        if length == 0:
            continue
        madvise(start, length, MADV_HUGEPAGE)  # also lets khugepaged do it later where collapse fails
        if madvise(start, length, MADV_COLLAPSE) == 0:
            collapsed += length
    return collapsed


def back_session_with_huge_pages(before: frozenset[Mapping]) -> None:
    """Collapse the mappings that appeared since ``before`` (the session's weights), and log it."""
    new = anonymous_mappings() - before
    total = sum(m.aligned[1] for m in new)
    collapsed = collapse(new)
    log.info("weights on huge pages: %d of %d MiB", collapsed >> 20, total >> 20)
