"""Memory plan: how many KV blocks the budget buys, and whether weights + KV fit in RAM.

The KV budget is absolute (``--kv-cache-space`` GiB, as on vLLM's CPU backend) because the
machine's memory is shared with the OS and other processes. The check runs before the session is
built, so a budget that cannot fit fails in a second with a message naming the flag and a value
that would fit, instead of the OOM killer ending the process later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ortserve.artifact import ArtifactManifest

GIB = 1 << 30
MEMINFO = Path("/proc/meminfo")
# ORT holds the weights once it has loaded them, plus prepacked copies for some MatMul kernels,
# plus activations and the arena: budget weights x WEIGHT_FACTOR + a fixed margin.
WEIGHT_FACTOR = 1.5
RUNTIME_MARGIN = GIB // 2
DEFAULT_FRACTION = 0.5  # an unset budget takes at most half of what is left after the weights


class MemoryCheckError(RuntimeError):
    """The weights and the KV budget do not fit; the message names --kv-cache-space."""


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    for line in MEMINFO.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{MEMINFO} has no MemAvailable line")


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    budget_bytes: int
    dtype: str = "fp32"  # KVCacheDtype: fp32, fp16 or int8 rows

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


def plan_kv_cache(
    manifest: ArtifactManifest,
    block_size: int,
    kv_cache_space: float | None,
    default_space: float,
    available: int | None = None,
    dtype: str = "fp32",
) -> KVCachePlan:
    """Blocks for the budget; raises MemoryCheckError when weights + KV exceed available memory."""
    available = available_memory() if available is None else available
    bytes_per_block = manifest.kv_bytes_per_token(dtype) * block_size
    fixed = int(manifest.weight_bytes * WEIGHT_FACTOR) + RUNTIME_MARGIN
    room = available - fixed
    if kv_cache_space is None:
        budget = min(int(default_space * GIB), int(max(room, 0) * DEFAULT_FRACTION))
        if budget < bytes_per_block:
            raise MemoryCheckError(
                f"the model needs about {fixed / GIB:.2f} GiB (weights {manifest.weight_bytes / GIB:.2f} GiB plus "
                f"runtime) and only {available / GIB:.2f} GiB is available, leaving nothing for the KV cache; "
                f"free memory, or use a smaller precision (--precision int4)"
            )
    else:
        budget = int(kv_cache_space * GIB)
        if budget > room:
            fits = _round_down_gib(room * 0.9)
            hint = (
                f"use --kv-cache-space {fits:g} or less"
                if fits > 0
                else "free memory or use a smaller model or precision"
            )
            raise MemoryCheckError(
                f"--kv-cache-space {kv_cache_space:g} GiB does not fit: the model needs about "
                f"{fixed / GIB:.2f} GiB (weights {manifest.weight_bytes / GIB:.2f} GiB plus runtime) and "
                f"{available / GIB:.2f} GiB is available; {hint}"
            )
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise MemoryCheckError(
            f"--kv-cache-space {budget / GIB:.3g} GiB holds no {block_size}-token block "
            f"({bytes_per_block} bytes each); use --kv-cache-space "
            f"{_round_up_gib(bytes_per_block * 64):g} or more"
        )
    return KVCachePlan(
        num_blocks=num_blocks, block_size=block_size, bytes_per_block=bytes_per_block, budget_bytes=budget, dtype=dtype
    )


def _round_down_gib(nbytes: float) -> float:
    return max(int(nbytes / GIB * 10) / 10, 0.0)


def _round_up_gib(nbytes: float) -> float:
    return math.ceil(nbytes / GIB * 1000) / 1000
