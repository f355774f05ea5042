"""The engine: scheduling and running (docs/design.md §3-4). One concept per module, in data-flow order:

- ``config``: ``EngineConfig`` and the command-line flags generated from it.
- ``ipc``: the msgspec messages between the API and engine processes (``EngineRequest`` in,
  ``RequestDelta``s and ``StatsUpdate``s out, error codes).
- ``sequence``: a ``Request`` and its n ``Sequence``s (request state).
- ``block_manager``: KV blocks, ref counts, the LRU free queue, prefix caching.
- ``scheduler``: what runs each step (budget, cap, chunked prefill, preemption).
- ``model_runner``: the ONNX Runtime session, the KV OrtValues, one IOBinding run per step.
- ``grammar``: structured outputs with llguidance (compiled grammars, masks per step).
- ``sampler``: logits -> tokens in numpy, vectorised over the batch.
- ``threads`` and ``memory``: the core and memory plans made before start-up.
- ``core``: ``EngineCore``: schedule -> run -> sample -> update, with faults contained per request.
- ``output_processor``: token ids -> text deltas and stop strings.
- ``llm_engine``: ``LLMEngine``, the one loop: the offline API, the CLI and the server's engine
  process all step it.

Importing this package imports nothing; ``model_runner`` alone imports onnxruntime.
"""
