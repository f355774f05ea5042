"""llama.cpp: convert the checkpoint to GGUF f32 with convert_hf_to_gguf.py from the
llama-cpp-python sdist, quantise it with llama-quantize (q8_0, q4_0), and serve it with the
native llama-server of the same build, one server per workload with --parallel = its
concurrency. llama-cpp-python's own server has no parallel slots (one request at a time), so it
would not be a fair serving peer."""

from __future__ import annotations

from runners.common import (
    BENCH_DIR,
    LLAMA_BIN,
    PEER_MODELS,
    PEERS_PY,
    PEERS_VENV,
    RESULTS,
    WORKLOADS,
    Model,
    Server,
    bench_serve,
    free_port,
    record,
    run_logged,
    serve_metrics,
)

SYSTEM = "llama.cpp"
PRECISIONS = ("fp32", "int8", "int4")
GGUF_TYPE = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}
WORKLOADS_SUPPORTED = tuple(WORKLOADS)
CTX_PER_SLOT = 1024


def convert_script():
    found = sorted(PEERS_VENV.glob("src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise RuntimeError("convert_hf_to_gguf.py not found: run bash benchmarks/peers/setup.sh")
    return found[-1]


def gguf_path(model_name: str, gguf_type: str):
    """Where llama-quantize's file of ``gguf_type`` ('q4_0', 'iq4_xs', ...) of the model is kept."""
    return PEER_MODELS / model_name / "llama.cpp" / f"{model_name}-{gguf_type}.gguf"


def gguf(model: Model, precision: str, gguf_type: str | None = None):
    """The model's GGUF file of ``gguf_type`` (default: the precision's, GGUF_TYPE), made on first use."""
    gguf_type = gguf_type or GGUF_TYPE[precision]
    folder = PEER_MODELS / model.name / "llama.cpp"
    f32 = folder / f"{model.name}-f32.gguf"
    if not f32.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        run_logged(
            [
                str(PEERS_PY),
                str(BENCH_DIR / "peers" / "convert_gguf.py"),
                str(convert_script()),
                "--pre-fallback",
                "qwen2",
                "--",
                str(model.hf_dir),
                "--outtype",
                "f32",
                "--outfile",
                str(f32),
            ],
            RESULTS / "logs" / f"gguf-{model.name}-f32.log",
        )
    out = gguf_path(model.name, gguf_type)
    if not out.is_file():
        run_logged(
            [str(LLAMA_BIN / "llama-quantize"), str(f32), str(out), gguf_type.upper(), "2"],
            RESULTS / "logs" / f"gguf-{model.name}-{gguf_type}.log",
        )
    return out


def run(
    model: Model,
    precision: str,
    workloads: list[str],
    system: str = SYSTEM,
    flags: tuple[str, ...] = (),
    gguf_type: str | None = None,
):
    path = gguf(model, precision, gguf_type)
    for name in workloads:
        w = WORKLOADS[name]
        port = free_port()
        argv = [
            str(LLAMA_BIN / "llama-server"),
            "-m",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            "2",
            "-tb",
            "2",
            "--parallel",
            str(w.concurrency),
            "-c",
            str(CTX_PER_SLOT * w.concurrency),
            "--metrics",
            "--alias",
            model.name,
            *flags,
        ]
        log = RESULTS / "logs" / f"{system}-server-{model.name}-{precision}-{name}.log"
        raw = RESULTS / "raw" / model.name / f"{system}--{precision}" / f"{name}.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        with Server(argv, port, log) as server:
            bench, cmd = bench_serve(server.base_url, model.name, model, w, raw, backend="llama.cpp")
        yield record(
            model.name,
            system,
            precision,
            w,
            serve_metrics(bench, w),
            f"{server.command} & {cmd}",
            raw,
            notes=f"GGUF {gguf_type or GGUF_TYPE[precision]} (llama-quantize default tensor types)",
        )
