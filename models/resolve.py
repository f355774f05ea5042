"""From what the user typed to a directory: ``resolve_model`` (any model argument -> the artifact
to serve, exported on first use), ``gguf_checkpoint`` (.gguf -> the checkpoint folder export
reads) and ``prepare_checkpoint`` (built-in name or .gguf -> a full fp32 Hugging Face checkpoint,
what transformers loads for validation and tests).

Cache layout (see ``cache.cache_dir``)::

    artifacts/<name>-<precision>-a<bits>/                 a built-in model's artifact
    artifacts/<stem>-<sha256[:16]>-<precision>-a<bits>/   a .gguf file's or checkpoint directory's artifact
    checkpoints/gguf/<stem>-<sha256[:16]>/        config, tokenizer and a link to a .gguf file
    checkpoints/<name>/                           a built-in model as a full fp32 checkpoint

An entry is keyed by its source's content hash and the export options, and holds
``ortserve-source.json``: what it was made from (content hash, options, a hash of the installed
exporter). When that stamp no longer matches (an edited checkpoint, an upgraded ortserve) the
entry is made again, so a stale one is never served; an unchanged source is reused wherever it
lives.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from pathlib import Path

from ortserve.artifact import DEFAULT_ACTIVATION_BITS, FORMAT_VERSION, PRECISIONS, ArtifactError, load_manifest

from . import cache
from .gguf_checkpoint import CONVERTER_VERSION, convert_gguf
from .registry import ModelSourceError, builtin_names, find_builtin
from .source import ModelSource, find_source, gguf_hash

logger = logging.getLogger(__name__)

SOURCE_STAMP = "ortserve-source.json"


def resolve_model(
    name_or_path: str | Path | None,
    *,
    precision: str | None = None,
    activation_bits: int = DEFAULT_ACTIVATION_BITS,
    progress: bool = True,
) -> Path:
    """The artifact directory to serve for any model argument (None: the default built-in).

    An artifact directory is itself (``precision`` and ``activation_bits`` are the artifact's own). A
    built-in name, a .gguf file or a Hugging Face checkpoint directory is exported once into the cache,
    keyed by its content, ``precision`` (None: the source's own -- fp32 for a checkpoint, the file's
    quantisation for a GGUF, the built-in's default precision) and ``activation_bits``, and reused
    after that.
    """
    if precision is not None and precision not in PRECISIONS:
        raise ModelSourceError(f"Unknown precision {precision!r}; use one of: {', '.join(PRECISIONS)}")
    source = find_source(name_or_path)
    if source.kind == "artifact":
        return source.path
    if precision is None and source.builtin is not None:
        precision = source.builtin.precision
    return _exported(source, precision, activation_bits, progress=progress)


def _exported(source: ModelSource, precision: str | None, activation_bits: int, *, progress: bool) -> Path:
    content = source.content_hash()
    tag = f"{precision or 'native'}-a{activation_bits}"
    name = f"{source.stem}-{tag}" if source.builtin else f"{source.stem}-{content[:16]}-{tag}"
    entry = cache.cache_dir() / "artifacts" / name
    stamp = {"content_sha256": content, "precision": tag, "exporter": exporter_hash()}
    if _loads(entry) and _stamp_matches(entry, stamp):
        return entry
    with cache.locked(entry):
        if _loads(entry) and _stamp_matches(entry, stamp):  # another process exported it while we waited
            return entry
        from ortserve.export import ExportError, export_model  # the exporter is heavy: only on first use

        logger.warning("Exporting %s (%s) to %s (done once, then cached)", source.label, tag, entry)
        cache.remove(entry)  # a stale or half-written one; export itself publishes by rename
        try:
            export_model(source.path, entry, precision=precision, activation_bits=activation_bits, progress=progress)
        except ExportError as exc:  # named once: many messages start with the source already
            message = str(exc)
            raise ModelSourceError(message if source.label in message else f"{source.label}: {message}") from exc
        (entry / SOURCE_STAMP).write_text(json.dumps({**stamp, "source": source.label}, indent=2) + "\n")
    return entry


def gguf_checkpoint(gguf_path: Path, *, progress: bool = True) -> Path:
    """The checkpoint folder export reads for a .gguf file: its config and tokenizer, converted
    from the metadata once, and ``model.gguf``, a link to the file (whose codes export keeps)."""
    gguf_path = Path(gguf_path).resolve()
    content = gguf_hash(gguf_path)
    entry = cache.cache_dir() / "checkpoints" / "gguf" / f"{ModelSource('gguf', gguf_path, '').stem}-{content[:16]}"
    stamp = {"converter_version": CONVERTER_VERSION, "content_sha256": content, "gguf": str(gguf_path)}
    return _converted(gguf_path, entry, stamp, weights=False, progress=progress)


def prepare_checkpoint(name_or_gguf_path: str | Path, *, progress: bool = True) -> Path:
    """The full fp32 Hugging Face checkpoint of a built-in model name or a .gguf file (what
    transformers loads), converted once into the user cache and reused while its source is
    unchanged."""
    builtin = find_builtin(str(name_or_gguf_path))
    if builtin is not None:
        gguf_path = builtin.gguf_path()
        entry = cache.cache_dir() / "checkpoints" / builtin.name
    else:
        gguf_path = Path(name_or_gguf_path).expanduser()
        if gguf_path.suffix.lower() != ".gguf" or not gguf_path.is_file():
            raise ModelSourceError(
                f"{str(name_or_gguf_path)!r} is neither a built-in model ({builtin_names()}) "
                "nor an existing .gguf file."
            )
        gguf_path = gguf_path.resolve()
        entry = cache.cache_dir() / "checkpoints" / "gguf-fp32" / f"{gguf_path.stem}-{gguf_hash(gguf_path)[:16]}"
    stamp = {"converter_version": CONVERTER_VERSION, "content_sha256": gguf_hash(gguf_path)}  # memoised
    return _converted(gguf_path, entry, stamp, weights=True, progress=progress)


def _converted(gguf_path: Path, entry: Path, stamp: dict, *, weights: bool, progress: bool) -> Path:
    if _stamp_matches(entry, stamp):
        return entry
    with cache.locked(entry):
        if _stamp_matches(entry, stamp):  # another process converted it while we waited
            return entry
        logger.warning("Converting %s to a Hugging Face checkpoint in %s (done once)", gguf_path.name, entry)
        started = time.perf_counter()
        with cache.staging_dir(entry) as scratch:
            convert_gguf(gguf_path, scratch, weights=weights, progress=progress)
            (scratch / SOURCE_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        logger.info("Converted %s in %.1f s", gguf_path.name, time.perf_counter() - started)
    return entry


def _loads(entry: Path) -> bool:
    try:
        load_manifest(entry)
    except (ArtifactError, ValueError, OSError):
        return False
    return True


def exporter_hash() -> str:
    """A hash of the installed exporter's and converter's source: a changed one re-exports."""
    digest = hashlib.sha256(f"format {FORMAT_VERSION}".encode())
    for package in ("ortserve.export", "ortserve.models"):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelSourceError(f"{package} is not installed; reinstall ortserve")
        for folder in spec.submodule_search_locations:
            for path in sorted([*Path(folder).glob("*.py"), *Path(folder).glob("*.txt")]):  # calibration.txt
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _stamp_matches(entry: Path, stamp: dict) -> bool:
    try:
        recorded = json.loads((entry / SOURCE_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return {key: recorded.get(key) for key in stamp} == stamp
