"""One log line per request (on by default): id, route, status, tokens in and out, latency."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("ortserve.requests")


@dataclass
class RequestLog:
    request_id: str
    route: str
    started: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def done(self, status: int | str) -> None:
        logger.info(
            "%s %s status=%s prompt_tokens=%d completion_tokens=%d latency_ms=%.0f",
            self.request_id,
            self.route,
            status,
            self.prompt_tokens,
            self.completion_tokens,
            (time.monotonic() - self.started) * 1000,
        )
