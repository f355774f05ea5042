"""``export_model``: SRC -> artifact directory, in stages (load, build, weights/quantise, save, validate).

Everything is written into a hidden temporary directory beside OUT and renamed into place at the
end, so a crash or a failed validation never leaves a half artifact at OUT.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import get_args

import onnx

from ortserve.artifact import (
    DEFAULT_ACTIVATION_BITS,
    MODEL_FILE,
    PRECISIONS,
    TOKENIZER_FILES,
    TOKENIZER_SETTINGS,
    ActivationBits,
    ArtifactManifest,
    Precision,
    has_tokenizer,
    is_artifact,
    needed_op_version,
    save_manifest,
)

from . import int4_fallback
from .architectures import architecture_for
from .calibration import CalibrationText, capture, reference_misfit
from .config import ModelSpec, read_config_json
from .errors import ExportError
from .gguf_checkpoint import GGUF_WEIGHTS, open_checkpoint
from .graph import DecoderBuilder, WeightJob
from .graph_io import OURS
from .quality import check
from .storage import FLOAT_TYPES, Storage, TensorPrecision
from .weights import DATA_FILE, WeightFile, WeightSource

logger = logging.getLogger(__name__)

# The LM head (often the tied embedding) is the matmul most sensitive to quantisation: at int4 it
# costs SmolLM2-135M 14 points of top-1 agreement with fp32 that int8 keeps, for 20 MB.
DEFAULT_LM_HEAD = {"fp32": "fp32", "int8": "int8", "int5": "int8", "int4": "int8"}


@dataclass
class _Bars:
    """One progress bar per stage (tqdm on stderr), or nothing."""

    enabled: bool

    @contextmanager
    def stage(self, name: str, total: float, unit: str = "it") -> Iterator:
        if not self.enabled:
            yield _NoBar()
            return
        from tqdm import tqdm

        scale = unit == "B"
        with tqdm(
            total=total,
            desc=f"{name:<9}",
            unit=unit,
            unit_scale=scale,
            unit_divisor=1024 if scale else 1000,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=True,
        ) as bar:
            yield bar


class _NoBar:
    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


def resolve_source(src: str | os.PathLike) -> tuple[Path, str]:
    """(checkpoint directory, label for the manifest) of a directory, .gguf file or built-in name."""
    path = Path(src).expanduser()
    if path.is_dir():
        if is_artifact(path):
            raise ExportError(f"{src} is already an ortserve artifact; SRC must be a Hugging Face checkpoint")
        return path, str(path.resolve())
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ExportError(f"{src} is a file; SRC must be a checkpoint directory, a .gguf file or a built-in model name")
    try:
        from ortserve.models import ModelSourceError, find_source, gguf_checkpoint
    except ImportError as exc:
        raise ExportError(
            f"{src} is not a directory, and GGUF files and built-in models need ortserve.models ({exc})"
        ) from exc
    try:
        source = find_source(src)
        return gguf_checkpoint(source.path), source.label if source.builtin else str(source.path)
    except ModelSourceError as exc:
        raise ExportError(str(exc)) from exc


def _check_out(out: Path) -> None:
    if out.exists() and not (is_artifact(out) or (out.is_dir() and not any(out.iterdir()))):
        raise ExportError(f"{out} exists and is not an ortserve artifact; choose another -o OUT or remove it")
    if out.parent.exists() and not out.parent.is_dir():
        raise ExportError(f"{out.parent} is a file; -o OUT must be a directory path")


def stored_precision(stored: dict[str, Storage], *, head: bool) -> Precision:
    """The manifest's precision of the LM head or of the other linears: the fewest bits any of
    them is stored with."""
    bits = min((p.bits for label, p in stored.items() if label.startswith("lm_head/") == head), default=32)
    return "int4" if bits <= 4 else "int5" if bits <= 5 else "int8" if bits <= 8 else "fp32"


def check_supported(spec: ModelSpec) -> None:
    """What the op library cannot run fails here, before any weight is read."""
    from ortserve.ops import MAX_HEAD_SIZE, MIN_HEAD_SIZE

    if not MIN_HEAD_SIZE <= spec.head_size <= MAX_HEAD_SIZE:
        raise ExportError(
            f"head_dim {spec.head_size} (config.json) is outside the {MIN_HEAD_SIZE}..{MAX_HEAD_SIZE} "
            "that ortserve's PagedAttention op supports; this model cannot be served"
        )


def _max_model_len(spec: ModelSpec, requested: int | None) -> int:
    trained = spec.max_position_embeddings
    if requested is None:
        return trained
    dynamic = any(r.kind == "dynamic" for r in spec.ropes.values())
    if requested < 1 or (requested > trained and not dynamic):
        raise ExportError(f"--max-model-len {requested} is outside 1..{trained} (this model's max_position_embeddings)")
    return requested


def _copy_side_files(src: Path, dst: Path, raw_config: dict) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    if not (dst / "generation_config.json").exists():
        generation = {k: raw_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in raw_config}
        (dst / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shutil.copy2(src / "config.json", dst / "config.json")


def _publish(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an old artifact at ``out`` is moved aside first, then deleted."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / out.name)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def peak_rss_bytes() -> int:
    """This process's peak RSS. Linux's VmHWM first: getrusage's ru_maxrss survives exec, so a
    process started from a big parent (a test runner) would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def export_model(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    precision: str | None = None,
    lm_head_precision: str | None = None,
    activation_bits: int = DEFAULT_ACTIVATION_BITS,
    tensor_precision: Sequence[str] = (),
    pure: bool = False,
    max_model_len: int | None = None,
    validate: bool = False,
    quality_check: bool = False,
    calibrate: bool = True,
    calibration_text: str | os.PathLike | None = None,
    progress: bool = True,
    fold_inputs: bool = True,
) -> ArtifactManifest:
    """Export a checkpoint directory, .gguf file or built-in model name to an artifact at ``out``.
    ``precision`` None keeps the source's own: fp32 for float tensors, a GGUF's quantised codes.
    ``activation_bits``: 16 (int8 plus a residual) or 8 (int8) activations in the quantised linears.
    ``tensor_precision``: 'PATTERN=PRECISION' rules for the linears whose names match (first wins).
    ``pure``: int4 stays 4 bits in every layer linear even where it loses the model's answers
    (``int4_fallback``; llama-quantize's --pure).
    ``calibrate``: weight the quantiser's error by each input column's importance on text
    (``calibration``; ``calibration_text`` a file of the user's own, else the built-in text).
    ``fold_inputs`` False keeps each norm and gated activation a node of its own (the calibration's
    fp32 reference, whose linears' inputs it reads; ``graph.DecoderBuilder``)."""
    started = time.perf_counter()
    if precision is not None and precision not in PRECISIONS:
        raise ExportError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if activation_bits not in get_args(ActivationBits):
        raise ExportError(f"--activation-bits {activation_bits!r} is not 8 or 16")
    lm_head_precision = lm_head_precision or (DEFAULT_LM_HEAD[precision] if precision else None)
    if lm_head_precision is not None and lm_head_precision not in PRECISIONS:
        raise ExportError(f"--lm-head-precision {lm_head_precision!r} is not one of {', '.join(PRECISIONS)}")
    rules = tuple(TensorPrecision.parse(rule) for rule in tensor_precision)
    text = CalibrationText.read(calibration_text) if calibrate else None  # a bad file fails before any work
    out = Path(out).expanduser().absolute()
    _check_out(out)
    folder, label = resolve_source(src)
    raw = read_config_json(folder)
    arch = architecture_for(raw["model_type"])
    spec = arch.read_config(raw, folder)
    check_supported(spec)
    max_len = _max_model_len(spec, max_model_len)
    checkpoint = open_checkpoint(folder, arch, raw)
    bars = _Bars(progress)

    source = WeightSource(checkpoint)
    make_builder = partial(
        DecoderBuilder,
        spec,
        arch,
        source,
        precision=precision,
        lm_head_precision=lm_head_precision,
        max_model_len=max_len,
        activation_bits=activation_bits,
        tensor_precision=rules,
        fold_inputs=fold_inputs,
    )
    builder = make_builder()
    model, jobs = builder.build()  # checks every tensor's name and shape before any data moves
    _check_rules_match(rules, builder.stored)
    _warn_requantised(builder.stored)
    with bars.stage("build", 1) as bar:  # shown once done, so a bad checkpoint prints one error line
        bar.set_postfix_str(f"{len(model.graph.node)} nodes, {len(jobs)} weight jobs")
        bar.update()
    quantises = any(p.kind == "quantize" for p in builder.stored.values())
    has_text = (folder / "tokenizer.json").is_file()
    misfit = reference_misfit(source.num_parameters())  # calibration and the quality check run an fp32 reference
    uncalibrated = "the source has no tokenizer.json to read the text with" if not has_text else misfit
    uncalibrated = uncalibrated if calibrate and quantises else ""  # why not, for the summary
    if quantises and misfit:
        logger.warning("quantising without calibration and without the quality check: %s", misfit)
    text = text if quantises and has_text and not misfit else None
    # only what ortserve quantised itself: a GGUF's own codes are the file's, checked by llama.cpp parity
    quality_check = quality_check and quantises and not misfit
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the artifact is an ordinary folder
    reference = None  # an fp32 export of the same source: the calibration's and the quality check's reference
    importance = None
    try:
        with bars.stage("load", checkpoint.total_bytes(), "B") as bar:
            fingerprint = checkpoint.fingerprint(bar.update)
        if text or (quality_check and has_text):
            reference = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".fp32", dir=out.parent))
            with bars.stage("fp32 ref", 1) as bar:
                export_model(
                    src, reference, precision="fp32", max_model_len=max_model_len, progress=False, fold_inputs=False
                )
                bar.update()
        if text and reference:
            with bars.stage("calibrate", 1) as bar:
                importance = capture(reference, text)
                bar.set_postfix_str(importance.summary())
                bar.update()
            builder = make_builder(importance=importance)
            model, jobs = builder.build()

        def write(builder: DecoderBuilder, model: onnx.ModelProto, jobs: list[WeightJob]) -> ArtifactManifest:
            """Quantise or copy every weight of a built graph, then save it and the manifest into tmp."""
            weights = WeightFile(tmp, DATA_FILE)
            try:
                stored = builder.stored.values()
                stage = "quantise" if any(p.kind == "quantize" for p in stored) else "weights"
                with bars.stage(stage, len(jobs)) as bar:
                    for job in jobs:
                        for name, array in job.make().items():
                            model.graph.initializer.append(weights.add(name, array))
                        bar.update()
            finally:
                weights.close()
            with bars.stage("save", 1) as bar:
                onnx.save_model(model, str(tmp / MODEL_FILE))
                _copy_side_files(folder, tmp, raw)
                manifest = ArtifactManifest(
                    op_version=needed_op_version(n.op_type for n in model.graph.node if n.domain == OURS),
                    architecture=spec.model_type,
                    num_layers=spec.num_layers,
                    hidden_size=spec.hidden_size,
                    num_heads=spec.num_heads,
                    num_kv_heads=spec.num_kv_heads,
                    head_size=spec.head_size,
                    vocab_size=spec.vocab_size,
                    max_model_len=max_len,
                    weight_precision=stored_precision(builder.stored, head=False),
                    lm_head_precision=stored_precision(builder.stored, head=True),
                    activation_bits=activation_bits,
                    weight_formats=dict(Counter(p.label for p in builder.stored.values())),
                    num_parameters=source.num_parameters(),
                    weight_bytes=weights.bytes,
                    source=label,
                    source_fingerprint=fingerprint,
                    calibration=importance.summary() if importance else "",
                    eos_token_ids=list(spec.eos_token_ids),
                )
                save_manifest(tmp, manifest)
                bar.update()
            return manifest

        manifest = write(builder, model, jobs)
        if precision == "int4" and not (pure or rules) and text is not None and importance and reference:
            with bars.stage("int4 check", 1) as bar:
                kept = int4_fallback.check(tmp, reference, text)
                bar.update()
            if int4_fallback.needs_more_bits(kept, spec.vocab_size):
                logger.warning(
                    "int4 everywhere loses this model's answers on the calibration text (%s); quantising again "
                    "with more bits where llama.cpp's Q4_K_M puts them (--pure keeps 4 bits everywhere)",
                    kept.summary("calibration text"),
                )
                more_bits = int4_fallback.rules(arch.names, spec.num_layers)
                builder = make_builder(importance=importance, tensor_precision=more_bits)
                model, jobs = builder.build()
                manifest = write(builder, model, jobs)
        export_peak = peak_rss_bytes()
        report = None
        if validate:
            from .validate import validate_artifact

            with bars.stage("validate", 1) as bar:
                exact = all(p.kind == "fp32" for p in builder.stored.values())
                report = validate_artifact(tmp, _reference_checkpoint(folder), tolerance=1e-3 if exact else None)
                bar.update()
            if not report.ok:
                raise ExportError(f"validation failed: {report.summary()}")
        quality = None
        if quality_check:
            with bars.stage("quality", 1) as bar:
                quality = check(tmp, reference) if reference else None
                bar.update()
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if reference:
            shutil.rmtree(reference, ignore_errors=True)
    if progress:
        _print_summary(
            manifest, out, time.perf_counter() - started, export_peak, report, quality, quality_check, uncalibrated
        )
    if quality is not None and quality.warning():
        logger.warning("%s", quality.warning())
    return manifest


def _reference_checkpoint(folder: Path) -> Path:
    """What transformers loads to validate against: the folder, or for a GGUF source its full
    fp32 checkpoint (transformers' own GGUF loading lacks some families' configs)."""
    linked = folder / GGUF_WEIGHTS
    if not linked.exists():
        return folder
    from ortserve.models import prepare_checkpoint

    return prepare_checkpoint(linked.resolve(), progress=False)


def _check_rules_match(rules: tuple[TensorPrecision, ...], stored: dict[str, Storage]) -> None:
    names = [key.split("/", 1)[1] for key in stored]
    for rule in rules:
        if not any(rule.pattern.search(name) for name in names):
            raise ExportError(
                f"--tensor-precision {str(rule)!r} matches no linear weight of this model; its names look like "
                f"{names[0]!r}"
            )


def _warn_requantised(stored: dict[str, Storage]) -> None:
    again = Counter(p.label for p in stored.values() if p.kind == "quantize" and p.source_type not in FLOAT_TYPES)
    if again:
        logger.warning(
            "GGUF tensors without an exact 4-, 5- or 8-bit form were dequantised and quantised again: %s",
            ", ".join(f"{label} x {count}" for label, count in sorted(again.items())),
        )


def _print_summary(
    m: ArtifactManifest,
    out: Path,
    seconds: float,
    export_peak: int,
    report,
    quality,
    quality_checked: bool,
    uncalibrated: str,
) -> None:
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    lines = [
        f"exported {m.architecture} to {out}",
        f"  parameters   {m.num_parameters / 1e6:,.1f} M",
        f"  weights      {m.weight_bytes / 2**20:,.1f} MiB ({m.weight_precision}, lm head {m.lm_head_precision}, "
        f"{m.activation_bits}-bit activations); "
        f"artifact {size / 2**20:,.1f} MiB",
        "  stored as    " + ", ".join(f"{label} x {count}" for label, count in sorted(m.weight_formats.items())),
        *([f"  calibrated   on {m.calibration} (GPTQ, error compensated on its inputs)"] if m.calibration else []),
        *([f"  calibrated   no: {uncalibrated}"] if uncalibrated else []),
        *(
            [f"  tokenizer    none: serve and generate need {' or '.join(TOKENIZER_SETTINGS)} in {out}"]
            if not has_tokenizer(out)
            else []
        ),
        f"  time         {seconds:.1f} s",
        f"  peak RSS     {export_peak / 2**20:,.0f} MiB"
        + (f" ({peak_rss_bytes() / 2**20:,.0f} MiB with validation)" if report is not None else ""),
    ]
    if report is not None:
        lines.append(f"  validation   {report.summary()}")
    if quality is not None:
        lines.append(f"  quality      {quality.summary()}" + ("" if quality.ok else "  << below the check"))
    elif quality_checked:
        lines.append("  quality      not checked: the source has no tokenizer.json to read the built-in text with")
    print("\n".join(lines), file=sys.stderr)
