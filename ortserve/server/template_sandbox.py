"""Chat templates sent by clients (--trust-request-chat-template): rendered in a worker process
with jinja2's sandbox, a time limit, a memory limit and an output size limit, so a hostile
template can neither stall the event loop nor take the server's memory.

A template that runs past ``timeout`` seconds gets its worker killed (a new one starts for the
next request) and the request a 400. The clock starts once the worker is up: starting one (a
spawned interpreter importing jinja2) is the server's cost, not the template's, and takes
seconds on a loaded machine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing as mp
from typing import Any

from .errors import BadRequest

MEMORY_LIMIT_BYTES = 1 << 30
STARTUP_TIMEOUT = 60.0  # seconds for a new worker to come up (not counted against a template)


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _started() -> bool:
    import jinja2.sandbox  # noqa: F401 - imported once, before any template's clock runs

    return True


def _render(
    template: str,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    kwargs: dict[str, Any],
    max_chars: int,
) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    pieces, size = [], 0
    for piece in env.from_string(template).generate(
        messages=conversation,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        **kwargs,
    ):
        size += len(piece)
        if size > max_chars:
            raise ValueError(f"the rendered prompt is longer than {max_chars} characters")
        pieces.append(piece)
    return "".join(pieces)


class TemplateSandbox:
    def __init__(self, timeout: float = 2.0, max_chars: int = 500_000) -> None:
        self.timeout = timeout
        self.max_chars = max_chars
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._started: asyncio.Future[bool] | None = None

    async def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=mp.get_context("spawn"), initializer=_limit_memory
            )
            self._started = asyncio.wrap_future(self._pool.submit(_started))
        pool, started = self._pool, self._started
        assert started is not None
        try:
            await asyncio.wait_for(asyncio.shield(started), STARTUP_TIMEOUT)
        except (TimeoutError, concurrent.futures.process.BrokenProcessPool):
            self._kill()
            raise BadRequest("the chat template sandbox could not start; retry", "chat_template") from None
        return pool

    async def render(
        self,
        template: str,
        conversation: list[dict[str, Any]],
        add_generation_prompt: bool,
        continue_final_message: bool,
        kwargs: dict[str, Any],
    ) -> str:
        pool = await self._executor()
        future = pool.submit(
            _render, template, conversation, add_generation_prompt, continue_final_message, kwargs, self.max_chars
        )
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
        except TimeoutError:
            self._kill()
            raise BadRequest(
                f"the request's chat template did not finish within {self.timeout:g} s", "chat_template"
            ) from None
        except concurrent.futures.process.BrokenProcessPool:
            self._kill()
            raise BadRequest("the request's chat template exhausted the sandbox's memory", "chat_template") from None
        except Exception as exc:  # noqa: BLE001 - the template's own error: jinja's, ValueError, MemoryError...
            raise BadRequest(f"the request's chat template failed: {str(exc)[:500]}", "chat_template") from None

    def _kill(self) -> None:
        pool, self._pool, self._started = self._pool, None, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._kill()
