"""One runner per system compared in benchmarks/compare.py. Each module exposes

    SYSTEM: str                       # the row label
    PRECISIONS: tuple[str, ...]       # fp32 / int8 / int4 (as ortserve names them)
    WORKLOADS_SUPPORTED: tuple[str, ...]  # which of common.WORKLOADS it can run
    run(model, precision, workloads) -> iterator of result records (common.record)

Peers run in the peers venv (benchmarks/peers/setup.sh) as subprocesses; ortserve runs from the
main environment. Servers listen on 127.0.0.1 only.
"""

from runners import genai, hf, llamacpp, ortserve_runner, variants

RUNNERS = {m.SYSTEM: m for m in (ortserve_runner, llamacpp, genai.Static, genai.Engine, hf, *variants.VARIANTS)}
