"""The OpenAI-compatible HTTP server (docs/design.md §5, §7).

Two processes: this package's Litestar app (HTTP, tokenisation, chat templates, detokenisation,
streaming) and the engine core (scheduler + runner, pinned to the inference cores), which
exchange the small typed messages of ``ipc.py``.

Modules, in the order a request meets them: ``cli`` (the command), ``app`` (wiring),
``auth``, ``controllers`` (the HTTP declarations), ``protocol`` / ``responses`` (the OpenAI
shapes), ``errors``, ``structured`` (response_format, structured_outputs, guided_*), ``tools`` /
``tool_parsers`` (tool calling), ``completions`` / ``chat`` / ``responses_api`` with
``response_items`` (requests -> engine -> responses), ``logprobs``, ``engine_client`` (async, in
this process), ``engine_process`` (the loop in the engine's process), ``metrics``.
"""
