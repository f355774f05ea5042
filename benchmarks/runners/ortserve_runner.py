"""ortserve: `ortserve export` the checkpoint at each precision, `ortserve serve` it, and measure
every workload with `ortserve bench serve` against the one server."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ortserve.models.resolve import exporter_hash

from runners.common import RESULTS, WORKLOADS, Model, Server, bench_serve, free_port, record, run_logged, serve_metrics

SYSTEM = "ortserve"
PRECISIONS = ("fp32", "int8", "int4")  # the runner protocol names what it measures: the peers' precisions
WORKLOADS_SUPPORTED = tuple(WORKLOADS)
EXPORTER_STAMP = "exporter.sha256"  # in an artifact: the exporter that wrote it (models.resolve.exporter_hash)


def artifact_path(model_name: str, precision: str, tag: str = "") -> Path:
    return RESULTS / "artifacts" / f"{model_name}-{precision}{tag}"


def artifact(model: Model, precision: str, export_flags: tuple[str, ...] = (), source: Path | None = None):
    """The model's artifact at ``precision``, exported on first use from its checkpoint or from ``source``
    (a GGUF file of it, whose codes export keeps), and again whenever the installed exporter differs from the
    one that wrote it (a changed layout must be measured, not an old one)."""
    tag = "".join(f"-{flag.lstrip('-')}" for flag in export_flags)  # e.g. -activation-bits-8
    tag += f"-from-{source.stem}" if source else ""
    out = artifact_path(model.name, precision, tag)
    stamp, exporter = out / EXPORTER_STAMP, exporter_hash()
    if not (out / "ortserve.json").is_file() or not stamp.is_file() or stamp.read_text() != exporter:
        shutil.rmtree(out, ignore_errors=True)
        run_logged(
            [
                sys.executable,
                "-m",
                "ortserve.cli",
                "export",
                str(source or model.hf_dir),
                "-o",
                str(out),
                "--precision",
                precision,
                *export_flags,
                "--quiet",
            ],
            RESULTS / "logs" / f"export-{model.name}-{precision}{tag}.log",
        )
        stamp.write_text(exporter)
    return out


def run(
    model: Model,
    precision: str,
    workloads: list[str],
    system: str = SYSTEM,
    flags: tuple[str, ...] = (),
    export_flags: tuple[str, ...] = (),
    source: Path | None = None,
):
    art = artifact(model, precision, export_flags, source)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "ortserve.cli",
        "serve",
        str(art),
        "--port",
        str(port),
        "--served-model-name",
        model.name,
        *flags,
    ]
    log = RESULTS / "logs" / f"{system}-{model.name}-{precision}.log"
    with Server(argv, port, log) as server:
        for name in workloads:
            w = WORKLOADS[name]
            raw = RESULTS / "raw" / model.name / f"{system}--{precision}" / f"{name}.json"
            raw.parent.mkdir(parents=True, exist_ok=True)
            bench, cmd = bench_serve(server.base_url, model.name, model, w, raw)
            exported = " ".join(
                (
                    "ortserve export",
                    str(source or model.hf_dir),
                    "-o",
                    str(art),
                    "--precision",
                    precision,
                    *export_flags,
                )
            )
            setup = f"{exported}; {server.command} &"
            yield record(model.name, system, precision, w, serve_metrics(bench, w), f"{setup} {cmd}", raw)
