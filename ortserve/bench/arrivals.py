"""When each request is sent: a Poisson process (or a gamma one, with burstiness), or all at once.

As in `vllm bench serve`, inter-arrival gaps are gamma(shape=burstiness, scale=1/(rate·burstiness))
(burstiness 1 = exponential = Poisson arrivals), accumulated, then rescaled so the last arrival
lands exactly at num_requests / rate, which keeps throughput stable across seeds.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request is sent. rate=inf sends everything at 0."""
    if num_requests <= 0:
        return []
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"--request-rate ({rate}) and --burstiness ({burstiness}) must be > 0")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    offsets = np.cumsum(gaps)
    offsets *= (num_requests / rate) / offsets[-1]
    return offsets.tolist()
