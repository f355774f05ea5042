"""Where initializer bytes come from (checkpoint tensors, transformed) and go to (model.onnx.data).

The graph builder only *plans* weights: a ``WeightJob`` names the initializers it will produce and
how. The weights stage runs the jobs one by one, appending each array to ``model.onnx.data`` and
keeping only a small ``TensorProto`` that points into the file, so at most one layer's tensors
are in memory at any time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .checkpoint import Checkpoint
from .errors import ExportError
from .gguf_checkpoint import GgufCheckpoint
from .hf_quantized import QuantizedCheckpoint
from .nbits import CodeLayout

DATA_FILE = "model.onnx.data"
_ALIGN = 64  # every tensor starts on a cache line;
_PAGE_ALIGN_ABOVE = 1 << 20  # large ones on a page, so ORT can mmap them


@dataclass
class WeightJob:
    """Produces named arrays for initializers when run (reading/transforming/quantising)."""

    label: str
    make: Callable[[], dict[str, np.ndarray]]


class WeightFile:
    """Appends arrays to the external data file; returns TensorProtos that reference them."""

    def __init__(self, folder: Path, name: str = DATA_FILE):
        self.name = name
        self._file = open(Path(folder) / name, "wb")
        self.bytes = 0

    def add(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        align = 4096 if array.nbytes >= _PAGE_ALIGN_ABOVE else _ALIGN
        offset = -(-self._file.tell() // align) * align
        self._file.write(b"\0" * (offset - self._file.tell()))
        self._file.write(memoryview(array).cast("B"))
        self.bytes += array.nbytes
        tensor = onnx.TensorProto(
            name=name,
            data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype),
            dims=array.shape,
            data_location=onnx.TensorProto.EXTERNAL,
        )
        for key, value in (("location", self.name), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        return tensor

    def close(self) -> None:
        self._file.close()


class WeightSource:
    """Checkpoint tensors by role, in the builder's layout: linear weights [out, in], float32
    (or, for a GGUF tensor, its codes: ``import_blocks``)."""

    def __init__(self, checkpoint: Checkpoint | GgufCheckpoint | QuantizedCheckpoint):
        self.checkpoint = checkpoint
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.checkpoint

    def expect(self, name: str, shape: tuple[int, ...], transpose: bool = False) -> str:
        """Check a tensor exists with the shape config.json implies; record it as a parameter."""
        actual = self.checkpoint.shape(name)
        if transpose:
            actual = actual[::-1]
        if tuple(actual) != tuple(shape):
            raise ExportError(
                f"tensor '{name}' has shape {list(actual)} but config.json implies {list(shape)}; "
                "the checkpoint does not match its config"
            )
        self.used.add(name)
        return name

    def read(self, name: str, transpose: bool = False) -> np.ndarray:
        array = self.checkpoint.read(name)
        if transpose:  # GPT-2's Conv1D keeps [in, out]; the builder wants [out, in]
            array = np.ascontiguousarray(array.T)
        return array

    def gguf_type(self, name: str) -> str:
        """The tensor's GGUF type name ('Q4_K', 'F32', ...); 'F32' for a safetensors tensor."""
        return self.checkpoint.gguf_type(name)

    def code_layout(self, name: str) -> CodeLayout | None:
        """How the tensor's own codes are held when ``import_blocks`` gives them exactly."""
        return self.checkpoint.code_layout(name)

    def import_blocks(self, name: str):
        """A quantised tensor's own codes and scales, exactly (GGUF blocks, or a quantised Hugging Face
        checkpoint's), in [out, in] row order: ``nbits.QuantizedWeight``, or a ``kquants`` weight for Q4_K, Q5_K,
        Q6_K and Q3_K."""
        return self.checkpoint.import_blocks(name)

    def num_parameters(self) -> int:
        return sum(int(np.prod(self.checkpoint.shape(n))) for n in self.used)
