"""One log line per request (on by default): id, route, status, tokens in and out, latency, and
the end-user id a client sent (``user``)."""

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
    created: int = field(default_factory=lambda: int(time.time()))  # wall clock, for response bodies
    prompt_tokens: int = 0
    completion_tokens: int = 0
    user: str | None = None

    def done(self, status: int | str) -> None:
        logger.info(
            "%s %s status=%s prompt_tokens=%d completion_tokens=%d latency_ms=%.0f%s",
            self.request_id,
            self.route,
            status,
            self.prompt_tokens,
            self.completion_tokens,
            (time.monotonic() - self.started) * 1000,
            f" user={self.user!r}" if self.user is not None else "",
        )
