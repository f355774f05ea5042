"""Request models -> the engine's ``SamplingParams``, checked against the model by ``PromptLimits``.

Both raise ``InvalidParameter`` (the one validation layer, shared with the offline API); here it
becomes a 400 naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ortserve.sampling_params import InvalidParameter, PromptLimits, SamplingParams

from .errors import BadRequest
from .protocol import SamplingRequest

EMPTY: Mapping[str, Any] = MappingProxyType({})


@contextmanager
def as_bad_request(fields: Any = None) -> Iterator[None]:
    """InvalidParameter -> a 400 naming the parameter (when the request model has it)."""
    try:
        yield
    except InvalidParameter as exc:
        param = exc.param if fields is None or exc.param in fields else None
        raise BadRequest(f"Invalid '{exc.param}': {exc}", param) from exc


def sampling_params(
    request: SamplingRequest,
    limits: PromptLimits,
    prompt_token_ids: list[int],
    *,
    max_tokens: int | None,
    default_max_tokens: int | None,
    logprobs: int | None,
    prompt_param: str,
    model_defaults: Mapping[str, Any] = EMPTY,
    **overrides: Any,
) -> SamplingParams:
    """The request's SamplingParams, with max_tokens settled against the prompt's room.
    ``model_defaults``: values for the fields the request leaves out (the model's
    generation_config.json, ``model_sampling_defaults``); ``overrides``: fields the endpoint
    settles itself (structured outputs, prompt logprobs...)."""
    fields = request.sampling_kwargs()
    fields.update({k: v for k, v in model_defaults.items() if k in fields and k not in request.model_fields_set})
    if max_tokens is None and "max_tokens" in model_defaults:
        default_max_tokens = int(model_defaults["max_tokens"])
    with as_bad_request(type(request).model_fields):
        params = SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **{**fields, **overrides})
        budget = limits.check(prompt_token_ids, params, prompt_param)  # max_tokens, at most the room
        if max_tokens is None and default_max_tokens is not None:
            budget = min(budget, max(default_max_tokens, params.min_tokens))
        params = replace(params, max_tokens=budget)  # a new SamplingParams: min_tokens is capped too
    return params
