"""Calibration for the quantiser: how the inputs of each linear behave on text, without torch.

The fp32 export of the same source runs the calibration text with one extra output per linear: the
Gram matrix of the linear's input over the tokens, X^T X. Divided by the tokens it is

- ``Importance.gram``: the Hessian of the layer's output error, for ``gptq.quantize_gptq``, which
  spreads each rounding error over the columns still to be rounded; its diagonal (each column's mean
  x^2, llama.cpp's importance matrix, ``llama-imatrix``) weights each column's error in the search
  for each block's scales (``qweight.quantize_q``).

On Gemma-3-270m, int4's top-1 agreement with fp32 on the quality check's text goes from 84.8 %
uncalibrated to 87.3 % with the diagonal alone and 88.9 % with GPTQ (benchmarks/tables/gptq.md).
A linear of K inputs holds K^2 floats while the export runs (Gemma-3-270m: 436 MB in all; the Qwen2.5-1.5B
shape's: 9.3 GB, mostly its 28 down projections' 8960^2). Each is held twice while the text runs (onnxruntime's
output and the running sum), so the full matrices are taken, smallest first, only while they fit in
``GRAM_SHARE`` of the memory left beside the fp32 model; the other linears get the diagonal alone
(``Importance.gram`` is then [K]; their quantiser weights each column's error by it, as llama.cpp's imatrix).
Before this, that model's export was killed for memory at 24 GiB.

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
from onnx import TensorProto, helper, numpy_helper

from ortserve.artifact import MODEL_FILE, load_manifest
from ortserve.engine.memory import available_memory

from .errors import ExportError

BUILTIN_TEXT = Path(__file__).with_name("calibration.txt")
CHUNK_TOKENS = 384  # tokens per calibration sequence, its BOS included (llama-imatrix's chunks)
MAX_TOKENS = 16384  # a longer text is cut here: statistics settle long before
GRAM_SHARE = 0.5  # of the memory available beside the fp32 model: what the full Gram matrices may take, twice held
REFERENCE_SHARE = 0.8  # of the available memory: the most the fp32 reference of a source may take


@dataclass(frozen=True)
class Importance:
    """Mean x x^T of the input of each layer linear and of the LM head [K, K] (or its diagonal [K], mean x^2, where
    memory did not allow the matrix), by the linear's label ('layers.3.qkv', 'lm_head')."""

    grams: dict[str, np.ndarray]
    tokens: int
    text: str  # where the text came from, for the export report

    def gram(self, label: str) -> np.ndarray | None:
        """The Gram matrix (or diagonal) of a linear's input, or of the fused linear it is a part of
        ('layers.3.qkv.0')."""
        return self.grams.get(label, self.grams.get(label.rsplit(".", 1)[0]))

    def summary(self) -> str:
        """'16,384 tokens of built-in text' (', 28 of 113 linears by their diagonal alone, for memory')."""
        diagonal = sum(g.ndim == 1 for g in self.grams.values())
        alone = f", {diagonal} of {len(self.grams)} linears by their diagonal alone, for memory" if diagonal else ""
        return f"{self.tokens:,} tokens of {self.text}{alone}"


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


def reference_misfit(parameters: int) -> str:
    """Why an fp32 reference of ``parameters`` weights cannot run here ('' when it fits in REFERENCE_SHARE of the
    available memory)."""
    need, have = 4 * parameters, available_memory()
    if need <= REFERENCE_SHARE * have:
        return ""
    return f"its fp32 reference ({need / 2**30:.1f} GiB) does not fit in the {have / 2**30:.1f} GiB available"


def capture(fp32_artifact: Path, text: CalibrationText) -> Importance:
    """Run ``text`` through ``fp32_artifact`` and return each layer linear's importance."""
    return capture_ids(fp32_artifact, text.sequences(fp32_artifact), text.description)


def capture_ids(
    fp32_artifact: Path, sequences: list[list[int]], description: str, budget: int | None = None
) -> Importance:
    """The same for token ids, each sequence prefilled in one step; ``budget``: the bytes the full Gram matrices
    may take (twice held), by default ``gram_budget``'s."""
    from .validate import PagedRunner

    with _instrumented(fp32_artifact, gram_budget(fp32_artifact) if budget is None else budget) as (folder, outputs):
        longest = max(len(s) for s in sequences)
        runner = PagedRunner(folder, block_size=16, num_blocks=-(-longest // 16) + 1)
        binding = runner.runner.binding
        for name in outputs.values():
            binding.bind_output(name, "cpu")
        first = 2 * runner.manifest.num_layers  # get_outputs(): the caches, then ours in bind order
        sums: dict[str, np.ndarray] = {}
        for i, tokens in enumerate(sequences):
            runner.step([(i, tokens)], all_logits=True)  # every row through the LM head, for its Gram
            runner.release(i)
            for label, value in zip(outputs, binding.get_outputs()[first : first + len(outputs)]):
                if label in sums:
                    sums[label] += value.numpy()
                else:
                    sums[label] = value.numpy().copy()
    tokens = sum(len(s) for s in sequences)
    for total in sums.values():
        total /= np.float32(tokens)  # in place: a second copy of every matrix is what the budget leaves no room for
    return Importance(sums, tokens, description)


def gram_budget(fp32_artifact: Path) -> int:
    """GRAM_SHARE of the memory available beside the fp32 model, in bytes."""
    return int(GRAM_SHARE * (available_memory() - load_manifest(fp32_artifact).weight_bytes))


def full_gram_labels(widths: dict[str, int], budget: int) -> set[str]:
    """The linears (label -> input width K) that get a full Gram matrix: the narrowest first, while their 2 K^2
    floats fit in ``budget`` bytes."""
    chosen, used = set(), 0
    for label, k in sorted(widths.items(), key=lambda item: (item[1], item[0])):
        used += 2 * k * k * 4
        if used > budget:
            break
        chosen.add(label)
    return chosen


@contextmanager
def _instrumented(artifact: Path, budget: int) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder beside ``artifact`` holding its graph with an output x^T x on the input x [T, K] of
    each fp32 linear (MatMulF), or sum(x^2) over T where ``full_gram_labels`` leaves it out, and hard links to its
    other files (onnxruntime reads external weights only from real files in the model's folder); yields (folder,
    {linear label: output name}), and removes the folder after."""
    folder = Path(tempfile.mkdtemp(prefix=".calibration.", dir=artifact.parent))
    try:
        model = onnx.load(str(artifact / MODEL_FILE), load_external_data=False)
        linears: dict[str, onnx.NodeProto] = {}
        for node in model.graph.node:
            if node.op_type == "MatMulF" and node.name.startswith(("layers.", "lm_head.")):
                if any(a.name in ("gated", "norm_epsilon") for a in node.attribute):
                    raise ValueError(f"{node.name}: an input stage hides its input; export with fold_inputs=False")
                linears[node.name.rsplit(".", 1)[0]] = node
        shapes = {t.name: t.dims for t in model.graph.initializer}  # MatMulF's W [N, K]
        widths = {label: int(shapes[node.input[1]][1]) for label, node in linears.items()}
        full = full_gram_labels(widths, budget)
        rows = "calibration.rows"
        model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), rows))
        outputs: dict[str, str] = {}
        for label, node in linears.items():
            x, outputs[label] = node.input[0], f"calibration.{label}"
            if label in full:
                transposed = f"calibration.{label}.xT"
                model.graph.node.append(helper.make_node("Transpose", [x], [transposed]))
                model.graph.node.append(helper.make_node("MatMul", [transposed, x], [outputs[label]]))
            else:
                model.graph.node.append(helper.make_node("ReduceSumSquare", [x, rows], [outputs[label]], keepdims=0))
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
