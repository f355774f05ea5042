"""What the HTTP side is configured with (the engine's own flags are in EngineConfig)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

DEFAULT_MAX_WAITING_REQUESTS = 256
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_QUEUED_TOKENS = 1 << 20  # about 17 minutes of prefill at 1,000 tokens/s


@dataclass
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    drain_timeout: float = 30.0
    trust_request_chat_template: bool = False
    public_metrics: bool = False
    allow_extra_fields: bool = False  # unknown top-level request fields: ignored instead of a 400
    tool_call_parser: str = "auto"  # hermes, llama3_json, mistral; auto = from the chat template
    started_at: int = field(default_factory=lambda: int(time.time()))

    def model_names(self) -> set[str]:
        return {self.served_model_name}
