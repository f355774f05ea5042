"""Reading a Hugging Face safetensors checkpoint tensor by tensor, without torch.

``model.safetensors`` or shards listed in ``model.safetensors.index.json``. Each read opens the
shard with safetensors' numpy API and closes it again, so the mmap of a multi-GB shard never stays
resident: at most one tensor (as float32) is in memory at a time. numpy has no bfloat16, so BF16
tensors are read from the file's byte range (the header says where) and widened to float32.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors import safe_open

from .errors import ExportError

INDEX = "model.safetensors.index.json"


def _fp8_e4m3_table() -> np.ndarray:
    """float32 value of each FP8 E4M3 (fn) byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
    infinities, 0x7F / 0xFF NaN."""
    byte = np.arange(256)
    exponent, mantissa = (byte >> 3) & 0xF, (byte & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    value = np.where(byte >> 7, -magnitude, magnitude)
    value[(byte & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


FP8_E4M3 = _fp8_e4m3_table()
SINGLE = "model.safetensors"


def sha256_files(paths: list[Path], progress: Callable[[int], None] | None = None, *, names: bool = False) -> str:
    """sha256 over the files' bytes in order (each preceded by its name with ``names``), read in
    16 MiB chunks; ``progress`` gets each chunk's size."""
    digest = hashlib.sha256()
    for path in paths:
        if names:
            digest.update(path.name.encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
                if progress:
                    progress(len(chunk))
    return digest.hexdigest()


class Checkpoint:
    """Tensor names -> shard files of one checkpoint directory; reads return float32 arrays."""

    def __init__(self, folder: Path, strip_prefixes: tuple[str, ...] = ()):
        self.folder = Path(folder)
        self._where: dict[str, tuple[Path, str]] = {}  # name -> (shard, name stored in the shard)
        self._headers: dict[Path, tuple[int, dict]] = {}
        for shard in self._shards():
            header_len, header = self._header(shard)
            self._headers[shard] = (header_len, header)
            for name in header:
                if name != "__metadata__":
                    self._where[name] = (shard, name)
        for prefix in strip_prefixes:  # e.g. GPT-2 checkpoints saved without "transformer."
            for name, where in list(self._where.items()):
                if not name.startswith(prefix):
                    self._where.setdefault(prefix + name, where)

    def _shards(self) -> list[Path]:
        index, single = self.folder / INDEX, self.folder / SINGLE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ExportError(f"{index} is not a valid safetensors index ({exc})") from exc
            shards = sorted({self.folder / f for f in weight_map.values()})
            missing = [s.name for s in shards if not s.is_file()]
            if missing:
                raise ExportError(f"{self.folder} lacks shard(s) {', '.join(missing)} listed in {INDEX}")
            return shards
        if single.is_file():
            return [single]
        others = sorted(p.name for p in self.folder.glob("*.bin")) + sorted(p.name for p in self.folder.glob("*.pt"))
        hint = (
            f" (found {', '.join(others[:3])}: PyTorch pickles are not read; re-save with safetensors)"
            if others
            else ""
        )
        raise ExportError(f"{self.folder} has no {SINGLE} or {INDEX}{hint}")

    @staticmethod
    def _header(shard: Path) -> tuple[int, dict]:
        try:
            with open(shard, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > 100_000_000 or length > shard.stat().st_size:
                    raise ValueError("header length out of range")
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error) as exc:
            raise ExportError(
                f"{shard} is not a readable safetensors file ({exc}); the checkpoint looks corrupt"
            ) from exc
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + length + end > shard.stat().st_size:
            raise ExportError(
                f"{shard} is truncated: the header describes {8 + length + end} bytes, "
                f"the file has {shard.stat().st_size}"
            )
        return length, header

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def _entry(self, name: str) -> tuple[Path, int, dict]:
        shard, stored = self._where[name]
        header_len, header = self._headers[shard]
        return shard, header_len, {**header[stored], "stored_name": stored}

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._where:
            raise ExportError(
                f"tensor '{name}' is missing from {self.folder}; the checkpoint is incomplete "
                "or does not match its config.json"
            )
        return tuple(self._entry(name)[2]["shape"])

    def read(self, name: str) -> np.ndarray:
        """The tensor as a contiguous float32 array."""
        return np.ascontiguousarray(self.read_stored(name), np.float32)

    def dtype(self, name: str) -> str:
        """The tensor's safetensors dtype: 'F32', 'BF16', 'I32', 'I8', ..."""
        self.shape(name)
        return str(self._entry(name)[2]["dtype"])

    def read_stored(self, name: str) -> np.ndarray:
        """The tensor in its stored dtype (integer codes stay integers); BF16 and F8_E4M3, which numpy
        lacks, as float32 (exactly: every such value is a float32)."""
        self.shape(name)
        shard, header_len, entry = self._entry(name)
        try:
            if entry["dtype"] in ("BF16", "F8_E4M3"):
                start, end = entry["data_offsets"]
                wide = entry["dtype"] == "BF16"
                count = (end - start) // (2 if wide else 1)
                raw = np.fromfile(shard, dtype="<u2" if wide else np.uint8, count=count, offset=8 + header_len + start)
                values = (raw.astype(np.uint32) << 16).view(np.float32) if wide else FP8_E4M3[raw]
                return values.reshape(entry["shape"])
            with safe_open(shard, framework="np") as f:
                return f.get_tensor(entry["stored_name"])
        except (OSError, ValueError, TypeError) as exc:
            raise ExportError(f"could not read '{name}' from {shard} ({exc}); the checkpoint looks corrupt") from exc

    def read_rows(self, name: str, count: int) -> np.ndarray:
        """The first ``count`` rows of a 2-D tensor as float32, without reading the rest."""
        shape = self.shape(name)
        shard, header_len, entry = self._entry(name)
        count = min(count, shape[0])
        try:
            if entry["dtype"] == "BF16":
                start = entry["data_offsets"][0]
                raw = np.fromfile(shard, dtype="<u2", count=count * shape[1], offset=8 + header_len + start)
                return (raw.astype(np.uint32) << 16).view(np.float32).reshape(count, shape[1])
            with safe_open(shard, framework="np") as f:
                return np.ascontiguousarray(f.get_slice(entry["stored_name"])[:count], dtype=np.float32)
        except (OSError, ValueError, TypeError) as exc:
            raise ExportError(f"could not read '{name}' from {shard} ({exc}); the checkpoint looks corrupt") from exc

    def gguf_type(self, name: str) -> str:
        return "F32"  # safetensors tensors are floats; they are read as float32

    def code_layout(self, name: str) -> None:
        return None  # float tensors have no codes

    def import_blocks(self, name: str):
        raise ExportError(f"tensor '{name}' of {self.folder} is a float tensor, not GGUF blocks")

    def files(self) -> list[Path]:
        return sorted(self._headers)

    def fingerprint(self, progress: Callable[[int], None] | None = None) -> str:
        """sha256 over config.json and every weight file, in name order."""
        return sha256_files([self.folder / "config.json", *self.files()], progress, names=True)

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in [self.folder / "config.json", *self.files()])
