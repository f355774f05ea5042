"""Calibration for the quantiser: how much each input column of each linear matters, measured on
text (llama.cpp's importance matrix, ``llama-imatrix``), without torch.

The fp32 export of the same source runs the calibration text with one extra output per linear:
ReduceSumSquare of the linear's input over the tokens. Each column's mean x^2 is the weight of
that column's error in ``qweight.quantize_q``: an error in a column that carries large activations
moves the output more. On Gemma-3-270m this takes int4's top-1 agreement with fp32 from 84.8 % to
87.5 % on the quality check's text (benchmarks/tables/quality.md).

The built-in text (``calibration.txt``: docstrings of Python's standard library, a mix of prose,
lists and code) is not the quality check's text, so the check stays an independent measurement.
``ortserve export --calibration-text FILE`` takes the user's own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortserve.artifact import MODEL_FILE, load_manifest

from .errors import ExportError

BUILTIN_TEXT = Path(__file__).with_name("calibration.txt")
CHUNK_TOKENS = 384  # tokens per calibration sequence, its BOS included (llama-imatrix's chunks)
MAX_TOKENS = 16384  # a longer text is cut here: statistics settle long before


@dataclass(frozen=True)
class Importance:
    """Mean x^2 per input column of each layer linear, by the linear's label ('layers.3.qkv')."""

    columns: dict[str, np.ndarray]
    tokens: int
    text: str  # where the text came from, for the export report

    def get(self, label: str) -> np.ndarray | None:
        """The importance of a linear, or of the fused linear it is a part of ('layers.3.qkv.0')."""
        return self.columns.get(label, self.columns.get(label.rsplit(".", 1)[0]))


@dataclass(frozen=True)
class CalibrationText:
    text: str
    description: str  # 'built-in text' or the file's path

    @classmethod
    def read(cls, path: str | os.PathLike | None) -> CalibrationText:
        """The file's text (the built-in text for None); an ExportError naming the flag if unusable."""
        file = BUILTIN_TEXT if path is None else Path(path).expanduser()
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ExportError(f"--calibration-text {path}: cannot read it as UTF-8 text ({exc})") from None
        if not text.strip():
            raise ExportError(f"--calibration-text {path}: the text is empty; give a file of ordinary text")
        return cls(text, "built-in text" if path is None else str(path))

    def sequences(self, artifact: Path) -> list[list[int]]:
        """Tokenised with the artifact's tokenizer, in chunks (of at most CHUNK_TOKENS and the model's
        length) that each start with the tokenizer's own prefix (its BOS)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(artifact / "tokenizer.json"))
        prefix = tokenizer.encode("").ids
        ids = tokenizer.encode(self.text, add_special_tokens=False).ids[:MAX_TOKENS]
        body = min(CHUNK_TOKENS, load_manifest(artifact).max_model_len) - len(prefix)
        return [prefix + ids[i : i + body] for i in range(0, len(ids), body) if len(ids) - i > 1]


def capture(fp32_artifact: Path, text: CalibrationText) -> Importance:
    """Run ``text`` through ``fp32_artifact`` and return each layer linear's importance."""
    return capture_ids(fp32_artifact, text.sequences(fp32_artifact), text.description)


def capture_ids(fp32_artifact: Path, sequences: list[list[int]], description: str) -> Importance:
    """The same for token ids, each sequence prefilled in one step."""
    from .validate import PagedRunner

    with _instrumented(fp32_artifact) as (folder, outputs):
        longest = max(len(s) for s in sequences)
        runner = PagedRunner(folder, block_size=16, num_blocks=-(-longest // 16) + 1)
        binding = runner.runner.binding
        for name in outputs.values():
            binding.bind_output(name, "cpu")
        first = 2 * runner.manifest.num_layers  # get_outputs(): the caches, then ours in bind order
        sums: dict[str, np.ndarray | float] = dict.fromkeys(outputs, 0.0)
        for i, tokens in enumerate(sequences):
            runner.step([(i, tokens)])
            runner.release(i)
            for label, value in zip(outputs, binding.get_outputs()[first : first + len(outputs)]):
                sums[label] += value.numpy().astype(np.float64)
    tokens = sum(len(s) for s in sequences)
    columns = {label: np.asarray(total / tokens, np.float32) for label, total in sums.items()}
    return Importance(columns, tokens, description)


@contextmanager
def _instrumented(artifact: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder beside ``artifact`` holding its graph with a ReduceSumSquare output on the input of
    each layer MatMul, and hard links to its other files (onnxruntime reads external weights only
    from real files in the model's folder); yields (folder, {linear label: output name}), and
    removes the folder after."""
    folder = Path(tempfile.mkdtemp(prefix=".calibration.", dir=artifact.parent))
    try:
        model = onnx.load(str(artifact / MODEL_FILE), load_external_data=False)
        axes = "calibration.axes"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), axes))
        outputs: dict[str, str] = {}
        for node in list(model.graph.node):
            if node.op_type == "MatMul" and node.name.startswith("layers."):
                label = node.name.rsplit(".", 1)[0]
                outputs[label] = f"calibration.{label}"
                model.graph.node.append(
                    helper.make_node("ReduceSumSquare", [node.input[0], axes], [outputs[label]], keepdims=0)
                )
                model.graph.output.append(helper.make_tensor_value_info(outputs[label], TensorProto.FLOAT, None))
        for file in artifact.iterdir():
            if file.is_file() and file.name != MODEL_FILE:
                try:
                    os.link(file, folder / file.name)
                except OSError:
                    shutil.copy2(file, folder / file.name)
        onnx.save_model(model, str(folder / MODEL_FILE))
        yield folder, outputs
    finally:
        shutil.rmtree(folder, ignore_errors=True)
