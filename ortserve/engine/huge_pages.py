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
runner builds the session inside ``weights_on_huge_pages``, which afterwards asks the kernel to
collapse them into huge pages at once (``MADV_COLLAPSE``, Linux 6.1+), or, on older kernels, marks
them for the background collapser (``MADV_HUGEPAGE``).

Where the weights land is malloc's choice: in new mappings in a fresh process, but after a large
block is freed (an export on first use, say) glibc serves blocks of up to 32 MiB from the free heap
it holds. So the candidates are the anonymous mappings that are new or grew while the session was
built, and in them only the huge pages whose every 4 KiB page is in use (``mincore``): collapsing
freed holes would fill them with memory. Free heap pages are returned first (``malloc_trim``), so
that what is resident is what is in use.

The KV cache gets huge pages from numpy, which asks for them for its own arrays of 4 MiB or more.
But ``np.zeros`` maps them lazily, and the block pool hands out its least recently used block, so a
fresh server walks the whole pool before it reuses a block: every new block would fault in (and
zero) its pages inside a decode step, about 6 % of a 16-stream server's CPU time on an AMD EPYC.
So the runner commits the cache at start (``populate``: ``MADV_POPULATE_WRITE``, Linux 5.14+;
0.2 s for 4 GiB there), as llama.cpp clears its KV buffer when it creates a context.
Every call is advice: where the kernel refuses (THP ``never``, another OS or C library), nothing
changes but the speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
PAGE = 4096
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
MADV_POPULATE_WRITE = 23
SMAPS = Path("/proc/self/smaps")


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int

    @property
    def aligned(self) -> tuple[int, int]:
        """The whole huge pages inside this mapping: (start, length), length 0 if none."""
        start = -(-self.start // HUGE_PAGE) * HUGE_PAGE
        return start, max(0, (self.end // HUGE_PAGE) * HUGE_PAGE - start)


def anonymous_mappings() -> dict[Mapping, int]:
    """This process's private, writable, anonymous mappings (and the heap) of at least one huge
    page, with their resident bytes."""
    if not SMAPS.exists():
        return {}
    found: dict[Mapping, int] = {}
    current: Mapping | None = None
    for line in SMAPS.read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
            start, end = (int(x, 16) for x in fields[0].split("-"))
            path = fields[5] if len(fields) > 5 else ""
            anonymous = fields[1].startswith("rw") and path in ("", "[heap]") and end - start >= HUGE_PAGE
            current = Mapping(start, end) if anonymous else None
        elif current is not None and fields[0] == "Rss:":
            found[current] = int(fields[1]) * 1024
    return found


class _Libc:
    """The few libc calls this needs, or None for each one that is missing (another OS or C library)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
        self.madvise = getattr(libc, "madvise", None)
        self.mincore = getattr(libc, "mincore", None)
        self.malloc_trim = getattr(libc, "malloc_trim", None)
        for call, argtypes in ((self.madvise, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
                               (self.mincore, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
                               (self.malloc_trim, [ctypes.c_size_t])):  # fmt: skip
            if call is not None:
                call.argtypes, call.restype = argtypes, ctypes.c_int


def in_use_huge_pages(mapping: Mapping, libc: _Libc) -> list[int]:
    """The starts of the aligned huge pages in ``mapping`` whose every 4 KiB page is resident."""
    start, length = mapping.aligned
    if length == 0 or libc.mincore is None:
        return []
    resident = np.zeros(length // PAGE, np.uint8)
    if libc.mincore(start, length, resident.ctypes.data) != 0:
        return []
    full = (resident.reshape(-1, HUGE_PAGE // PAGE) & 1).all(axis=1)
    return [start + int(i) * HUGE_PAGE for i in np.flatnonzero(full)]


def collapse(pages: list[int], libc: _Libc) -> int:
    """Ask for huge pages at ``pages`` (aligned starts) now; returns the bytes the kernel collapsed."""
    if libc.madvise is None:
        return 0
    collapsed = 0
    for start in pages:
        libc.madvise(start, HUGE_PAGE, MADV_HUGEPAGE)  # also lets khugepaged do it later where collapse fails
        if libc.madvise(start, HUGE_PAGE, MADV_COLLAPSE) == 0:
            collapsed += HUGE_PAGE
    return collapsed


def populate(arrays: Iterable[np.ndarray]) -> bool:
    """Fault in (and zero) every page of ``arrays`` now rather than at their first write; False
    where the kernel cannot (before Linux 5.14): their pages stay lazy."""
    libc = _Libc()
    if libc.madvise is None:
        return False
    for array in arrays:
        start = array.ctypes.data // PAGE * PAGE
        length = array.ctypes.data + array.nbytes - start
        if array.nbytes and libc.madvise(start, length, MADV_POPULATE_WRITE) != 0:
            log.debug("not populated (errno %d): the pages fault in as used", ctypes.get_errno())
            return False
    return True


@dataclass
class HugePageReport:
    in_use_bytes: int = 0  # the whole, resident huge pages of the mappings that appeared or grew
    collapsed_bytes: int = 0


@contextmanager
def weights_on_huge_pages() -> Iterator[HugePageReport]:
    """Build the session inside: on exit the memory it filled is collapsed and logged, and the
    report is filled in."""
    libc = _Libc()
    if libc.malloc_trim is not None:
        libc.malloc_trim(0)
    before = anonymous_mappings()
    report = HugePageReport()
    yield report
    grown = [m for m, rss in anonymous_mappings().items() if rss >= before.get(m, 0) + HUGE_PAGE]
    pages = [page for mapping in sorted(grown, key=lambda m: m.start) for page in in_use_huge_pages(mapping, libc)]
    report.in_use_bytes = len(pages) * HUGE_PAGE
    report.collapsed_bytes = collapse(pages, libc)
    log.info("weights on huge pages: %d of %d MiB", report.collapsed_bytes >> 20, report.in_use_bytes >> 20)
