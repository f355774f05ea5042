"""The engine: scheduling and running (DESIGN.md §3-4). One concept per module, in data-flow order:

- ``config``: ``EngineConfig`` and the shared command-line flags.
- ``messages``: ``EngineRequest`` in, ``EngineCoreOutput`` out, ``EngineStats`` (picklable).
- ``sequence``: a ``Request`` and its n ``Sequence``s (request state).
- ``block_manager``: KV blocks, ref counts, the LRU free queue, prefix caching.
- ``scheduler``: what runs each step (budget, cap, chunked prefill, preemption).
- ``model_runner``: the ONNX Runtime session, the KV OrtValues, one IOBinding run per step.
- ``sampler``: logits -> tokens in numpy, vectorised over the batch.
- ``threads`` and ``memory``: the core and memory plans made before start-up.
- ``core``: ``EngineCore``, the loop body that ties them together.
- ``output_processor``: token ids -> text and stop strings, on the API side.

Importing this package imports nothing; ``model_runner`` alone imports onnxruntime.
"""
