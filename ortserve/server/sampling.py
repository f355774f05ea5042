"""Request models -> the engine's ``SamplingParams``; its ValueErrors become 400s naming the field."""
from __future__ import annotations

from typing import Any

from ortserve.sampling_params import SamplingParams

from .errors import BadRequest
from .protocol import SamplingRequest


def sampling_params(request: SamplingRequest, *, max_tokens: int, logprobs: int | None) -> SamplingParams:
    kwargs: dict[str, Any] = request.sampling_kwargs()
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)
    except ValueError as exc:  # the message starts with the field's name
        message = str(exc)
        field = message.split(" ", 1)[0]
        raise BadRequest(f"Invalid '{field}': {message}",
                         field if field in type(request).model_fields else None) from exc
