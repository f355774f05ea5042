"""What a model argument names, and the content hash that keys its cached export.

One argument everywhere (``ortserve serve|export|generate MODEL``, ``LLM(model=...)``): an
artifact directory, a Hugging Face checkpoint directory, a ``.gguf`` file or a built-in name.
``find_source`` tells them apart (or says what would be accepted); ``ModelSource.content_hash``
is a sha256 over the files that define the model, so an edited checkpoint is exported again and
an unchanged one, wherever it is, reuses its cache entry. Hashing a large file is memoised by
its (path, inode, size, mtime): a second start does not read the weights again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortserve.artifact import TOKENIZER_FILES, is_artifact

from . import cache
from .registry import DEFAULT_MODEL, BuiltinModel, ModelSourceError, builtin_names, find_builtin

SourceKind = Literal["artifact", "builtin", "gguf", "checkpoint"]

# What defines a Hugging Face checkpoint: its config, weights and tokenizer (the artifact copies
# the tokenizer files, so a changed chat template is a changed model too).
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", *TOKENIZER_FILES)


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    path: Path  # the artifact or checkpoint directory, or the .gguf file
    label: str  # what the user named: a built-in name or the path as given
    builtin: BuiltinModel | None = None

    @property
    def stem(self) -> str:
        """A readable prefix for cache entries."""
        name = self.builtin.name if self.builtin else (self.path.stem if self.kind == "gguf" else self.path.name)
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "model"

    def files(self) -> list[Path]:
        if self.kind == "builtin":
            return [self.path]
        if self.kind == "gguf":  # a split GGUF's shards, those present (conversion names any missing)
            return [p for p in shard_paths(self.path) if p.is_file()]
        files = [self.path / name for name in CHECKPOINT_FILES if (self.path / name).is_file()]
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ModelSourceError(f"{index} is not a valid safetensors index ({exc})") from exc
            files += [self.path / shard for shard in shards if (self.path / shard).is_file()]
        return files

    def content_hash(self) -> str:
        """sha256 over the defining files' names and bytes, in order."""
        digest = hashlib.sha256()
        for path in self.files():
            digest.update(path.name.encode() + b"\0" + file_hash(path).encode())
        return digest.hexdigest()


_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama.cpp's gguf-split: NAME-00001-of-00003.gguf


def shard_name(name: str, number: int, count: int) -> str:
    """A split GGUF's shard ``number`` (from 1) of ``count``, named after another shard's ``name``."""
    return _SHARD.sub(f"-{number:05d}-of-{count:05d}.gguf", name)


def shard_paths(path: Path) -> list[Path]:
    """The files of the GGUF model whose file or first shard is ``path``, by name alone: ``path``, or for
    ``NAME-00001-of-0000N.gguf`` the N shards beside it, whether they exist or not (the exporter's
    ``read_gguf`` checks them against their metadata)."""
    match = _SHARD.search(path.name)
    if match is None or int(match[1]) != 1:
        return [path]
    count = int(match[2])
    return [path.with_name(shard_name(path.name, i, count)) for i in range(1, count + 1)]


def gguf_hash(path: Path) -> str:
    """sha256 of a .gguf file, or over a split GGUF's shards (their names and hashes, in order)."""
    shards = [p for p in shard_paths(path) if p.is_file()]
    if len(shards) == 1:
        return file_hash(path)
    digest = hashlib.sha256()
    for shard in shards:
        digest.update(shard.name.encode() + b"\0" + file_hash(shard).encode())
    return digest.hexdigest()


def find_source(name_or_path: str | os.PathLike | None) -> ModelSource:
    """What ``name_or_path`` names (None: the default built-in model), or a ModelSourceError
    that lists what is accepted."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    text = str(name_or_path)
    path = Path(text).expanduser()
    if is_artifact(path):
        return ModelSource("artifact", path, text)
    builtin = find_builtin(text)
    if builtin is not None and not path.exists():
        return ModelSource("builtin", builtin.gguf_path(), builtin.name, builtin)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelSource("gguf", path.resolve(), text)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource("checkpoint", path.resolve(), text)
    if path.exists():
        raise ModelSourceError(
            f"{path} is not an ortserve artifact (no ortserve.json and model.onnx), a Hugging Face "
            f"checkpoint directory (no config.json) or a .gguf file. Built-in models: {builtin_names()}"
        )
    raise ModelSourceError(
        f"Unknown model {text!r}: not a built-in model name and no such path. Pass an artifact "
        f"directory, a Hugging Face checkpoint directory or a .gguf file; built-in models: {builtin_names()}"
    )


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, memoised in the cache by (path, inode, size, mtime)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}"
    memo = cache.cache_dir() / "hashes.json"
    known = _read_json(memo)
    if key in known:
        return str(known[key])
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    value = digest.hexdigest()
    with cache.locked(memo):
        known = _read_json(memo)
        known[key] = value
        memo.parent.mkdir(parents=True, exist_ok=True)
        scratch = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps(known, indent=0))
        os.replace(scratch, memo)
    return value


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
