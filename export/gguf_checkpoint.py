"""Reading a GGUF file's tensors as a Hugging Face checkpoint, without torch.

A GGUF source is exported from a folder that holds its ``config.json`` and tokenizer (written by
``ortserve.models`` from the file's metadata) and ``model.gguf``, a link to the file itself.
``GgufCheckpoint`` answers what ``Checkpoint`` answers -- tensors by Hugging Face name, in
Hugging Face layout, as float32 -- and one more thing: ``import_blocks``, a quantised tensor's own
codes and scales, exactly (``gguf_blocks.py``, ``kquants.py``). Names map through gguf's own tensor
name table; what llama.cpp's converter changed is undone from the architecture's ``GgufLayout``
(Q/K row order, norm offsets, transposed GPT-2 weights).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from ortserve.models.source import shard_name, shard_paths

from .architectures import Architecture
from .checkpoint import Checkpoint, sha256_files
from .errors import ExportError
from .gguf_blocks import FORMATS, import_blocks
from .hf_quantized import QuantizedCheckpoint, quantization_method
from .kquants import LAYOUTS, KQuantWeight, import_kquant
from .nbits import CodeLayout, QuantizedWeight

GGUF_WEIGHTS = "model.gguf"  # in a GGUF source's checkpoint folder: a link to the file (a split GGUF's first shard)


@dataclass(frozen=True)
class GgufModel:
    """A GGUF model's readers: one file, or every shard of a split one (llama.cpp's gguf-split), in order; the
    first holds the metadata, each some of the tensors."""

    paths: list[Path]
    readers: list  # gguf.GGUFReader

    @property
    def metadata(self) -> dict[str, Any]:
        return {key: field.contents() for key, field in self.readers[0].fields.items()}

    @property
    def tensors(self) -> list:
        return [tensor for reader in self.readers for tensor in reader.tensors]


def read_gguf(path: Path) -> GgufModel:
    """The GGUF model at ``path``: the file, or a split GGUF's first shard and the others found beside it by
    name. A later shard, a missing one or a renamed one is an ExportError that says which file to give."""
    first = _reader(path)
    count, number = (_split_field(first, key) for key in ("split.count", "split.no"))
    if count <= 1:
        return GgufModel([path], [first])
    paths = shard_paths(path)
    if number != 0:
        name = shard_name(path.name, 1, count)
        raise ExportError(
            f"{path} is shard {number + 1} of {count} of a split GGUF: give the first, {name} (the others are read "
            "from beside it)"
        )
    if len(paths) != count:
        raise ExportError(
            f"{path} is the first of {count} shards of a split GGUF, but its name does not end in "
            f"-00001-of-{count:05d}.gguf, so the others cannot be found: keep the names llama-gguf-split gave them"
        )
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ExportError(
            f"{path} is the first of {count} shards of a split GGUF, and {len(missing)} of the others are not beside "
            f"it in {path.parent}: {', '.join(missing)}"
        )
    readers = [first, *(_reader(p) for p in paths[1:])]
    for i, (p, reader) in enumerate(zip(paths, readers)):
        if _split_field(reader, "split.no") != i or _split_field(reader, "split.count") != count:
            raise ExportError(
                f"{p} is not shard {i + 1} of {count} of the split GGUF {path.name}: its split.no / split.count differ"
            )
    return GgufModel(paths, readers)


def _reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(path, "r")
    except Exception as exc:  # the reader raises bare ValueErrors/struct errors on bad files
        raise ExportError(f"{path} is not a readable GGUF file: {exc}") from exc


def _split_field(reader, key: str) -> int:
    field = reader.fields.get(key)
    return 0 if field is None else int(field.contents())


def open_checkpoint(
    folder: Path, arch: Architecture, config: dict[str, Any]
) -> Checkpoint | GgufCheckpoint | QuantizedCheckpoint:
    """The tensors of a checkpoint folder: its GGUF file when it links one, else its safetensors
    (quantised ones through ``hf_quantized``)."""
    gguf_file = Path(folder) / GGUF_WEIGHTS
    if gguf_file.exists():
        return GgufCheckpoint(gguf_file.resolve(), arch, config)
    if gguf_file.is_symlink():
        raise ExportError(f"{gguf_file} links to {gguf_file.readlink()}, which no longer exists")
    method = quantization_method(config, Path(folder))
    checkpoint = Checkpoint(folder, arch.strip_prefixes)
    return checkpoint if method is None else QuantizedCheckpoint(checkpoint, method, config["quantization_config"])


def gguf_tensor_names(arch: Architecture, num_layers: int) -> dict[str, str]:
    """Hugging Face parameter name -> GGUF tensor name, for every weight the graph reads."""
    import gguf

    if arch.gguf is None:
        raise ExportError(f"architecture '{arch.name}' has no GGUF layout")
    arch_ids = [key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch.gguf.arch]
    table = gguf.get_tensor_name_map(arch_ids[0], num_layers)
    names: dict[str, str] = {}
    for field in fields(arch.names):  # later fields win: a fused gate_up over a plain up
        template = getattr(arch.names, field.name)
        if template is None:
            continue
        for module in [template.format(i=i) for i in range(num_layers)] if "{i}" in template else [template]:
            base = table.get_name(module)
            if base is not None:
                for suffix in (".weight", ".bias"):
                    names[module + suffix] = base + suffix
    return names


def rotary_row_order(rows: int, heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's Q/K permutation: per head, the converter stores
    rows as (pair, half) where Hugging Face has (half, pair). ``w_hf = w_gguf[order]``."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


class GgufCheckpoint:
    """The tensors of one GGUF model (a file, or a split GGUF's shards) by Hugging Face name; reads return
    float32 arrays."""

    def __init__(self, path: Path, arch: Architecture, config: dict[str, Any]):
        self.path = Path(path)
        self.layout = arch.gguf
        model = read_gguf(self.path)
        self.paths = model.paths
        layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
        by_name = {t.name: t for t in model.tensors}
        self._where = {hf: by_name[g] for hf, g in gguf_tensor_names(arch, layers).items() if g in by_name}
        self._heads: dict[str, int] = {}
        if self.layout is not None and self.layout.permute_qk:
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            for name in self._where:
                if ".q_proj." in name or ".k_proj." in name:
                    self._heads[name] = heads if ".q_proj." in name else kv_heads

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def _tensor(self, name: str):
        if name not in self._where:
            raise ExportError(
                f"tensor '{name}' (GGUF name per gguf's table) is missing from {self.path}; the file "
                "is incomplete or does not match its metadata"
            )
        return self._where[name]

    def _transposed(self, name: str) -> bool:
        return self.layout is not None and any(f".{m}." in name for m in self.layout.transposed)

    def shape(self, name: str) -> tuple[int, ...]:
        ggml = tuple(int(n) for n in self._tensor(name).shape)  # ne0 (contiguous) first
        return ggml if self._transposed(name) else ggml[::-1]

    def gguf_type(self, name: str) -> str:
        return str(self._tensor(name).tensor_type.name)

    def read(self, name: str) -> np.ndarray:
        """The tensor as Hugging Face holds it, float32: dequantised by gguf, layout undone."""
        import gguf

        tensor = self._tensor(name)
        ggml = tuple(int(n) for n in tensor.shape)
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(ggml[::-1])
        if name in self._heads:
            array = array[rotary_row_order(array.shape[0], self._heads[name])]
        if self.layout is not None and self.layout.norm_shift and name.endswith("norm.weight"):
            array = array - np.float32(self.layout.norm_shift)
        if self._transposed(name):
            array = array.T
        return np.ascontiguousarray(array, dtype=np.float32)

    def read_rows(self, name: str, count: int) -> np.ndarray:
        return self.read(name)[:count]

    def code_layout(self, name: str) -> CodeLayout | None:
        """How the codes ``import_blocks`` gives are held exactly: MatMulQ{code bits} (or Q4NL), or MatMulQ4K /
        Q5K / Q6K / Q3K for the K-quants; None for a format without an exact form."""
        qtype = self.gguf_type(name)
        if qtype in LAYOUTS:
            return LAYOUTS[qtype]
        fmt = FORMATS.get(qtype)
        if fmt is None:
            return None
        # every format without float offsets has its codes' middle as zero point: centred ("S")
        return CodeLayout(fmt.code_bits, ("NL" if fmt.nonlinear else "") + ("" if fmt.offsets else "S"))

    def import_blocks(self, name: str) -> QuantizedWeight | KQuantWeight:
        """The tensor's codes and scales, exactly ([out, in] rows): the K-quants' as they are (``kquants``), every
        other format's per block of 32 in the nbits container (``qweight.from_blocks`` makes them a MatMulQ weight)."""
        tensor = self._tensor(name)
        cols, rows = (int(n) for n in tensor.shape)
        if tensor.tensor_type.name in LAYOUTS:
            q: QuantizedWeight | KQuantWeight = import_kquant(tensor.data, tensor.tensor_type.name, rows, cols)
        else:
            q = import_blocks(tensor.data, tensor.tensor_type.name, rows, cols)
        return q.take_rows(rotary_row_order(rows, self._heads[name])) if name in self._heads else q

    def files(self) -> list[Path]:
        return list(self.paths)

    def fingerprint(self, progress: Callable[[int], None] | None = None) -> str:
        """sha256 of the GGUF file (or its shards)."""
        return sha256_files(self.paths, progress)

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)
