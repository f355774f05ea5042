"""Hugging Face checkpoints whose linears are stored quantised, read as integer codes:

- compressed-tensors (llm-compressor's W4A16 / W8A16 / W8A8-int8 checkpoints, as vLLM reads them):
  formats ``pack-quantized`` (``weight_packed`` int32, values + 2^(bits-1) packed densely along K,
  ``weight_scale``, optional ``weight_zero_point`` packed along N) and ``int-quantized``
  (``weight`` int8 with ``weight_scale`` and optional ``weight_zero_point``), and ``float-quantized``
  (``weight`` FP8 E4M3 times ``weight_scale``: W8A8-FP8; no integer form, so read as floats);
- AutoAWQ's GEMM format (``quant_method: awq``): ``qweight`` int32 [K, N / 8] and ``qzeros`` int32
  [K / group, N / 8] with the nibbles of each word in AWQ's order 0, 2, 4, 6, 1, 3, 5, 7, ``scales``
  [K / group, N];
- GPTQ (``quant_method: gptq``, AutoGPTQ / GPTQModel, 4 or 8 bits): ``qweight`` int32 [K * bits / 32,
  N] (row k in bits ``bits * (k % p)`` of word k // p, p = 32 / bits), ``qzeros`` int32 [K / group,
  N * bits / 32] packed the same way along N and holding zero - 1 (``checkpoint_format`` gptq; zero
  itself for gptq_v2), ``scales`` [K / group, N], ``g_idx`` [K] (each column's group).

Either way w[n, k] = scale[n, k // group] * (q[n, k] - zero[n, k // group]). Groups of a multiple
of 32 columns (or whole rows) are MatMulQ's blocks of 32 with each group's scale repeated, so
``import_blocks`` gives the codes exactly, as a GGUF's are (``storage.plan`` keeps them whatever the
precision; bit for bit with fp16 or bf16 scales, as checkpoints store them: a float32 scale's
product with the zero point can round). Smaller groups and ``--precision fp32`` read the weight
dequantised (the products in float64, then float32). Other methods (bitsandbytes, HQQ, ...) and
act-order (GPTQ's desc_act, whose ``g_idx`` is not k // group) are refused at export with what to use
instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import ExportError
from .nbits import BLOCK_SIZE, CodeLayout, QuantizedWeight, pack

COMPRESSED_TENSORS_FORMATS = ("pack-quantized", "int-quantized", "float-quantized")
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i of a word holds column 8j + AWQ_ORDER[i]
_SUPPORTED = (
    "compressed-tensors (pack-quantized, int-quantized, float-quantized: llm-compressor's W4A16, W8A16, W8A8, "
    "W8A8-FP8), AutoAWQ (GEMM) "
    "and GPTQ (4 or 8 bits, without desc_act)"
)
GPTQ_FORMATS = ("gptq", "gptq_v2")


def quantization_method(config: dict[str, Any], folder: Path) -> str | None:
    """'compressed-tensors' or 'awq' for a checkpoint this module reads, None for an unquantised
    one; an ExportError naming the method and the alternatives for any other."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "?"))
    if method == "compressed-tensors":
        formats = {qc.get("format")} | {g.get("format") for g in (qc.get("config_groups") or {}).values()}
        unknown = sorted(str(f) for f in formats - {None, *COMPRESSED_TENSORS_FORMATS})
        if not unknown:
            return method
        what = f"compressed-tensors format {', '.join(unknown)}"
    elif _reads(method, qc):
        return method
    else:
        details = ", ".join(f"{key} {qc[key]!r}" for key in ("version", "bits", "checkpoint_format") if key in qc)
        what = f"quant_method {method!r}" + (f" ({details})" if details else "")
    raise ExportError(
        f"{folder} is quantised with {what}, which ortserve does not read; it reads {_SUPPORTED}. "
        "Export the unquantised checkpoint (ortserve quantises it: --precision int4|int8) or a GGUF of it"
    )


def _reads(method: str, qc: dict[str, Any]) -> bool:
    """Whether an AWQ or GPTQ checkpoint is of a layout this module reads."""
    bits = int(qc.get("bits", 4))
    if method == "awq":
        return str(qc.get("version", "gemm")).lower() == "gemm" and bits == 4
    return method == "gptq" and bits in (4, 8) and qc.get("checkpoint_format", "gptq") in GPTQ_FORMATS


@dataclass(frozen=True)
class IntCodes:
    """One linear: w[n, k] = scale[n, k // group_size] * (codes[n, k] - zero[n, k // group_size])."""

    codes: np.ndarray  # uint8 [N, K], 0 .. 2^bits - 1
    scale: np.ndarray  # float32 [N, G]
    zero: np.ndarray  # uint8 [N, G]
    bits: int

    def __post_init__(self) -> None:
        k, groups = self.codes.shape[1], self.scale.shape[1]
        if k % groups:
            raise ExportError(f"{groups} scale groups do not divide {k} columns; the checkpoint looks corrupt")

    @property
    def group_size(self) -> int:
        return int(self.codes.shape[1] // self.scale.shape[1])

    def dequantize(self) -> np.ndarray:
        group = np.arange(self.codes.shape[1]) // self.group_size
        steps = self.codes.astype(np.float64) - self.zero[:, group]
        return (self.scale[:, group].astype(np.float64) * steps).astype(np.float32)

    def blocks(self) -> QuantizedWeight | None:
        """The codes as MatMulQ blocks of 32 when groups are whole blocks, else None."""
        n, k = self.codes.shape
        if k % BLOCK_SIZE or self.group_size % BLOCK_SIZE:
            return None
        block_group = np.arange(k // BLOCK_SIZE) * BLOCK_SIZE // self.group_size
        return QuantizedWeight(
            packed=pack(self.codes.reshape(n, k // BLOCK_SIZE, BLOCK_SIZE), self.bits),
            scales=np.ascontiguousarray(self.scale[:, block_group], np.float32),
            zero_points=pack(self.zero[:, block_group], self.bits),
            bits=self.bits,
        )


def _per_row(scale: np.ndarray, n: int) -> np.ndarray:
    """A compressed-tensors scale as [N, G]: per group [N, G], per row [N, 1], per tensor [1] or []."""
    flat = scale.reshape(-1)
    return np.broadcast_to(flat.reshape(1, -1), (n, flat.size)).copy() if flat.size < n else flat.reshape(n, -1)


def _unpack_dense(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """compressed-tensors' dense packing: value i of a row at bit i * bits of its little-endian words."""
    data = np.ascontiguousarray(words).astype("<i4").view(np.uint8).reshape(words.shape[0], -1)
    if bits == 8:
        return data[:, :count]
    return np.stack([data & 0x0F, data >> 4], axis=-1).reshape(words.shape[0], -1)[:, :count]


def _unpack_along_columns(words: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ's packing: int32 [R, C] -> uint8 [R, C * 32 / bits], value j of word c in bits bits * j,
    the column c * 32 / bits + j (the same as dense packing for 4 and 8 bits)."""
    return np.ascontiguousarray(_unpack_dense(np.ascontiguousarray(words), bits, words.shape[1] * 32 // bits))


def _bits_of(packed_cols: int, k: int, name: str) -> int:
    for bits in (4, 8):
        if packed_cols == -(-k * bits // 32):
            return bits
    raise ExportError(f"'{name}' packs {k} columns into {packed_cols} words: only 4- and 8-bit codes are read")


class QuantizedCheckpoint:
    """A quantised checkpoint's tensors by Hugging Face name (``module.weight`` for a quantised
    linear too), as ``Checkpoint`` answers them, and each quantised linear's codes."""

    def __init__(self, base: Checkpoint, method: str, settings: dict[str, Any]):
        """``settings``: config.json's quantization_config."""
        self.base, self.method = base, method
        self.bits = int(settings.get("bits", 4))
        self.stored_zero_minus_one = settings.get("checkpoint_format", "gptq") == "gptq"  # GPTQ v1
        self.folder = base.folder
        self._codes: dict[str, IntCodes] = {}  # the last module read: fused parts ask twice
        self._quantised = {m for m in map(self._module_of, base.names()) if m is not None}
        act_order = [name for name in base.names() if name.endswith(".weight_g_idx")]
        if act_order:
            raise ExportError(
                f"{self.folder} stores act-order group indices ({act_order[0]}), which ortserve does not read; "
                "export the unquantised checkpoint (ortserve quantises it: --precision int4|int8) or a GGUF of it"
            )

    def _module_of(self, stored: str) -> str | None:
        module, _, field = stored.rpartition(".")
        if self.method in ("awq", "gptq"):
            return module if field == "qweight" else None
        if field == "weight_packed" or (field == "weight_scale" and f"{module}.weight" in self.base):
            return module
        return None

    def _quantised_module(self, name: str) -> str | None:
        module = name.removesuffix(".weight")
        return module if name.endswith(".weight") and module in self._quantised else None

    def __contains__(self, name: str) -> bool:
        return self._quantised_module(name) is not None or name in self.base

    def names(self) -> list[str]:
        return [*self.base.names(), *(f"{m}.weight" for m in self._quantised)]

    def shape(self, name: str) -> tuple[int, ...]:
        module = self._quantised_module(name)
        if module is None:
            return self.base.shape(name)
        if self.method == "awq":
            k, words = self.base.shape(f"{module}.qweight")
            return words * 8, k
        if self.method == "gptq":
            words, n = self.base.shape(f"{module}.qweight")
            return n, words * 32 // self.bits
        if f"{module}.weight_shape" in self.base:
            return tuple(int(v) for v in self.base.read_stored(f"{module}.weight_shape"))
        return self.base.shape(f"{module}.weight")

    def codes(self, module: str) -> IntCodes:
        if module not in self._codes:
            read = {"awq": self._read_awq, "gptq": self._read_gptq}.get(self.method, self._read_ct)
            self._codes = {module: read(module)}
        return self._codes[module]

    def _read_ct(self, module: str) -> IntCodes:
        base = self.base
        n, k = self.shape(f"{module}.weight")
        scale = _per_row(base.read(f"{module}.weight_scale"), n).astype(np.float32)
        if f"{module}.weight_packed" in base:
            packed = base.read_stored(f"{module}.weight_packed")
            bits = _bits_of(packed.shape[1], k, f"{module}.weight_packed")
            codes = _unpack_dense(packed, bits, k)
        else:
            bits, codes = 8, (base.read_stored(f"{module}.weight").astype(np.int16) + 128).astype(np.uint8)
        offset = 1 << (bits - 1)
        zero = np.full(scale.shape, offset, np.uint8)
        if f"{module}.weight_zero_point" in base:
            stored = base.read_stored(f"{module}.weight_zero_point")
            if stored.dtype == np.int32:  # pack-quantized: packed along N, values + offset
                zero = _unpack_dense(stored.T, bits, n).T
            else:
                zero = np.broadcast_to((_per_row(stored, n).astype(np.int16) + offset).astype(np.uint8), scale.shape)
        return IntCodes(np.ascontiguousarray(codes), scale, np.ascontiguousarray(zero), bits)

    def _read_awq(self, module: str) -> IntCodes:
        def nibbles(words: np.ndarray) -> np.ndarray:  # [R, C] int32 -> [R, 8 C] in column order
            values = (words.astype("<i4").view(np.uint32)[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
            ordered = np.empty_like(values)
            ordered[..., AWQ_ORDER] = values
            return ordered.reshape(words.shape[0], -1).astype(np.uint8)

        codes = nibbles(self.base.read_stored(f"{module}.qweight")).T  # [N, K]
        scale = np.ascontiguousarray(self.base.read(f"{module}.scales").T)  # [N, G]
        if f"{module}.qzeros" in self.base:
            zero = np.ascontiguousarray(nibbles(self.base.read_stored(f"{module}.qzeros")).T)
        else:
            zero = np.full(scale.shape, 8, np.uint8)
        return IntCodes(np.ascontiguousarray(codes), scale, zero, 4)

    def _read_gptq(self, module: str) -> IntCodes:
        bits, base = self.bits, self.base
        codes = _unpack_along_columns(base.read_stored(f"{module}.qweight").T, bits)  # [N, K]
        scale = np.ascontiguousarray(base.read(f"{module}.scales").T)  # [N, G]
        zero = _unpack_along_columns(base.read_stored(f"{module}.qzeros"), bits).T[:, : scale.shape[1]]
        if self.stored_zero_minus_one:
            zero = (zero.astype(np.int16) + 1) & ((1 << bits) - 1)  # v1 holds zero - 1 (wrapping, as readers do)
        codes_of = IntCodes(codes, scale, np.ascontiguousarray(zero, np.uint8), bits)
        if f"{module}.g_idx" in base:
            g_idx = base.read_stored(f"{module}.g_idx").astype(np.int64)
            if not np.array_equal(g_idx, np.arange(len(g_idx)) // codes_of.group_size):
                raise ExportError(
                    f"{module}.g_idx orders columns by activation (GPTQ's desc_act), which ortserve does not read; "
                    "export the unquantised checkpoint (ortserve quantises it: --precision int4|int8) or a GGUF of it"
                )
        return codes_of

    def read(self, name: str) -> np.ndarray:
        module = self._quantised_module(name)
        if module is None:
            return self.base.read(name)
        return self._read_fp8(module) if self._fp8(module) else self.codes(module).dequantize()

    def read_rows(self, name: str, count: int) -> np.ndarray:
        module = self._quantised_module(name)
        return self.base.read_rows(name, count) if module is None else self.read(name)[:count]

    def _fp8(self, module: str) -> bool:
        weight = f"{module}.weight"
        return self.method == "compressed-tensors" and weight in self.base and self.base.dtype(weight).startswith("F8")

    def _read_fp8(self, module: str) -> np.ndarray:
        """weight * scale (per tensor, row or group of columns), each product exact in float64."""
        weight = self.base.read_stored(f"{module}.weight").astype(np.float64)  # FP8 values, exactly
        n, k = weight.shape
        scale = _per_row(self.base.read(f"{module}.weight_scale").astype(np.float64), n)
        if k % scale.shape[1]:
            raise ExportError(f"{module}.weight_scale's {scale.shape[1]} groups do not divide {k} columns")
        return (weight * np.repeat(scale, k // scale.shape[1], axis=1)).astype(np.float32)

    def gguf_type(self, name: str) -> str:
        """'F32' for a float tensor; for a quantised linear, what it is: 'awq int4 g128',
        'compressed-tensors fp8 per-row'."""
        module = self._quantised_module(name)
        if module is None:
            return "F32"
        if self._fp8(module):
            groups = int(np.prod(self.base.shape(f"{module}.weight_scale"))) // self.shape(name)[0]
            return f"{self.method} fp8 {'per-row' if groups <= 1 else f'g{self.shape(name)[1] // groups}'}"
        codes = self.codes(module)
        grouping = "per-row" if codes.scale.shape[1] == 1 else f"g{codes.group_size}"
        return f"{self.method} int{codes.bits} {grouping}"

    def code_layout(self, name: str) -> CodeLayout | None:
        """How the codes ``import_blocks`` gives are held exactly (blocks of 32), or None."""
        module = self._quantised_module(name)
        if module is None or self._fp8(module) or self.codes(module).blocks() is None:
            return None
        return CodeLayout(self.codes(module).bits)

    def import_blocks(self, name: str) -> QuantizedWeight:
        module = self._quantised_module(name)
        blocks = None if module is None or self._fp8(module) else self.codes(module).blocks()
        if blocks is None:
            raise ExportError(f"tensor '{name}' of {self.folder} has no exact block form")
        return blocks

    def files(self) -> list[Path]:
        return self.base.files()

    def fingerprint(self, progress: Callable[[int], None] | None = None) -> str:
        return self.base.fingerprint(progress)

    def total_bytes(self) -> int:
        return self.base.total_bytes()
