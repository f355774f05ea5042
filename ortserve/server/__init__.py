"""The OpenAI-compatible HTTP server (docs/design.md §5-6).

Two processes: this package's Litestar app (HTTP, tokenisation, chat templates, detokenisation,
streaming) and the engine core (scheduler + runner, pinned to the inference cores), which
exchange the small typed messages of ``ipc.py``.

Modules, in the order a request meets them: ``cli`` (the command), ``app`` (wiring),
``auth``, ``controllers`` (the HTTP declarations), ``protocol`` / ``responses`` (the OpenAI
shapes), ``errors``, ``prompts`` (tokenisation, chat template), ``completions`` / ``chat``
(requests -> engine -> responses), ``logprobs``, ``engine_client`` (async, in this process),
``engine_process`` (the loop in the engine's process), ``metrics``.
"""
