"""Calibration: each linear input's Gram matrix (mean x x^T) and its diagonal (mean x^2) on text,
captured torch-free from the fp32 export and checked against transformers' own activations; the
quantisers that use them (the diagonal-weighted search, GPTQ); and export's flags. Its effect on a
real model's quality is measured in benchmarks/tables/quality.md (Gemma-3-270m int4), not here: tiny
random models have no text to fit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ortserve.export import calibration, export_model
from ortserve.export.calibration import CHUNK_TOKENS, CalibrationText, capture, capture_ids, full_gram_labels
from ortserve.export.errors import ExportError
from ortserve.export.gptq import quantize_calibrated
from ortserve.export.qweight import quantize_q
from ortserve.export.validate import random_sequences


def transformers_importance(checkpoint: Path, sequences: list[list[int]]) -> dict[str, np.ndarray]:
    """Mean x x^T of the input of each linear (Linear, GPT-2's Conv1D) and of the LM head, by module name."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    sums: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, inputs, output):
            x = inputs[0].reshape(-1, inputs[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + x.T @ x

        return record

    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            module.register_forward_hook(hook(name))
    with torch.inference_mode():
        for ids in sequences:
            model(torch.tensor([ids]))
    tokens = sum(map(len, sequences))
    return {name: (total / tokens).float().numpy() for name, total in sums.items()}


@pytest.fixture(scope="module")
def reference_artifact(tmp_path_factory):
    """``reference_artifact(checkpoint)``: the fp32 export the calibration reads, as export makes it
    for itself: norms and gated activations nodes of their own (``fold_inputs=False``), so that every
    linear's input is a tensor of the graph."""
    built: dict[Path, Path] = {}

    def get(checkpoint: Path) -> Path:
        if checkpoint not in built:
            built[checkpoint] = tmp_path_factory.mktemp("reference") / "fp32"
            export_model(checkpoint, built[checkpoint], precision="fp32", progress=False, fold_inputs=False)
        return built[checkpoint]

    return get


def test_capture_needs_the_linears_inputs_in_the_graph(tiny_llama_artifact):
    """A served artifact runs each norm inside its linear: the linear's input is no tensor to read."""
    with pytest.raises(ValueError, match="an input stage hides its input; export with fold_inputs=False"):
        capture(tiny_llama_artifact, CalibrationText.read(None))


def test_capture_equals_transformers_activations(tiny_llama_checkpoint, reference_artifact):
    artifact = reference_artifact(tiny_llama_checkpoint)
    importance = capture(artifact, CalibrationText.read(None))
    sequences = CalibrationText.read(None).sequences(artifact)
    assert len(sequences) > 3 and all(len(s) <= CHUNK_TOKENS for s in sequences)
    assert importance.tokens == sum(map(len, sequences)) and importance.text == "built-in text"
    reference = transformers_importance(tiny_llama_checkpoint, sequences)
    ours = {  # q, k and v read one input, as do gate and up: one fused linear each
        "q_proj": "qkv",
        "k_proj": "qkv",
        "v_proj": "qkv",
        "o_proj": "o",
        "gate_proj": "gate_up",
        "up_proj": "gate_up",
        "down_proj": "down",
    }
    assert "lm_head" in reference
    for name, expected in reference.items():
        layer, kind = name.split(".")[2] if "." in name else "", name.rsplit(".", 1)[-1]
        gram = importance.gram(f"layers.{layer}.{ours[kind]}" if layer else "lm_head")
        np.testing.assert_allclose(gram, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
        np.testing.assert_allclose(np.diag(gram), np.diag(expected), rtol=2e-5)
    assert importance.gram("layers.0.qkv.1") is importance.gram("layers.0.qkv")  # a part of a split linear


@pytest.mark.parametrize("case", ["gpt2_conv1d", "phi3_fused_partial_rotary", "gemma3_local_global"])
def test_capture_finds_every_linear_of_fused_and_conv1d_families(case, tiny_checkpoint, reference_artifact):
    """Fused q/k/v and gate/up, GPT-2's Conv1D, Gemma's norms around each block: every linear input
    transformers sees is one of ours, and each of ours is one of transformers'."""
    sequences = random_sequences(320, [40, 23], seed=4)
    ours = capture_ids(reference_artifact(tiny_checkpoint(case)), sequences, "random ids")
    reference = list(transformers_importance(tiny_checkpoint(case), sequences).values())
    assert ours.tokens == 63 and len(ours.grams) == 4 * 2 + 1  # qkv, o, gate_up (or up), down x 2 layers; head

    def matches(a, b):
        return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))

    assert all(any(matches(mine, theirs) for theirs in reference) for mine in ours.grams.values())
    assert all(any(matches(mine, theirs) for mine in ours.grams.values()) for theirs in reference)


def test_full_grams_go_to_the_narrowest_linears_within_the_budget():
    widths = {"layers.0.down": 96, "layers.0.qkv": 64, "layers.1.qkv": 64, "lm_head": 64, "layers.0.o": 80}
    per = {k: 2 * k * k * 4 for k in (64, 80, 96)}  # bytes: onnxruntime's output and the running sum, fp32
    assert full_gram_labels(widths, 3 * per[64]) == {"layers.0.qkv", "layers.1.qkv", "lm_head"}
    assert full_gram_labels(widths, 3 * per[64] + per[80]) == set(widths) - {"layers.0.down"}
    assert full_gram_labels(widths, 3 * per[64] + per[80] + per[96]) == set(widths)
    assert full_gram_labels(widths, per[64] - 1) == set()


def test_linears_beyond_the_budget_get_the_exact_diagonal(tiny_llama_checkpoint, reference_artifact):
    """Under a budget that holds only the narrow inputs' matrices, the wide ones (the down projections) get their
    input's mean x^2 alone: transformers' diagonal, and the matrices the same as with room for all."""
    artifact = reference_artifact(tiny_llama_checkpoint)
    sequences = random_sequences(320, [40, 23], seed=4)
    everything = capture_ids(artifact, sequences, "random ids", budget=1 << 40)
    widths = {label: gram.shape[0] for label, gram in everything.grams.items()}
    narrow = min(widths.values())
    room = sum(8 * k * k for k in widths.values() if k == narrow)
    tight = capture_ids(artifact, sequences, "random ids", budget=room)
    wide = {label for label, k in widths.items() if k > narrow}
    assert wide and {label for label, g in tight.grams.items() if g.ndim == 1} == wide
    for label, gram in tight.grams.items():
        full = everything.grams[label]
        expected = np.diag(full) if label in wide else full
        np.testing.assert_allclose(gram, expected, rtol=1e-5, atol=1e-6 * float(np.abs(expected).max()))
    alone = f"{len(wide)} of {len(widths)} linears by their diagonal alone, for memory"
    assert tight.summary() == f"63 tokens of random ids, {alone}"
    w = np.random.default_rng(0).normal(size=(32, widths["layers.0.down"])).astype(np.float32)
    by_diagonal = quantize_calibrated(w, 4, tight.gram("layers.0.down"))
    assert np.array_equal(by_diagonal.codes, quantize_q(w, 4, np.diag(everything.gram("layers.0.down"))).codes)


def test_export_calibrates_within_the_memory_it_has(tiny_llama_checkpoint, tmp_path, monkeypatch):
    """With little memory beside the fp32 model, the export still calibrates: the wide linears on their diagonal,
    as the manifest says."""
    monkeypatch.setattr(calibration, "gram_budget", lambda artifact: 2 * 8 * 64 * 64)  # two 64-wide matrices
    export_model(tiny_llama_checkpoint, tmp_path / "int4", precision="int4", progress=False)
    manifest = json.loads((tmp_path / "int4" / "ortserve.json").read_text())
    assert manifest["calibration"].endswith("linears by their diagonal alone, for memory"), manifest["calibration"]


def test_a_model_whose_fp32_reference_does_not_fit_is_quantised_uncalibrated(
    tiny_llama_checkpoint, tmp_path, monkeypatch, caplog
):
    """Calibration and the quality check run the fp32 model: where it cannot fit, export says so and goes on."""
    monkeypatch.setattr(calibration, "available_memory", lambda: 1 << 20)
    with caplog.at_level("WARNING"):
        export_model(tiny_llama_checkpoint, tmp_path / "int4", precision="int4", progress=False)
    assert json.loads((tmp_path / "int4" / "ortserve.json").read_text())["calibration"] == ""
    assert "quantising without calibration and without the quality check: its fp32 reference" in caplog.text
    assert "does not fit in the 0.0 GiB available" in caplog.text


@pytest.mark.parametrize("bits", [4, 8])
def test_importance_lowers_the_error_where_it_weighs(bits):
    """With a few columns of large activations, the weighted search trades error elsewhere for less
    error there: its output error (the importance-weighted error) is lower than the plain search's."""
    rng = np.random.default_rng(3)
    w = rng.standard_t(5, size=(256, 512)).astype(np.float32) * 0.02
    importance = rng.gamma(0.3, size=512).astype(np.float32)  # heavy-tailed, as real activations
    weighted = ((quantize_q(w, bits, importance).dequantize() - w) ** 2 * importance).sum()
    plain = ((quantize_q(w, bits).dequantize() - w) ** 2 * importance).sum()
    assert weighted < 0.9 * plain


def test_uniform_importance_keeps_a_q4_1_grid_exact():
    rng = np.random.default_rng(0)
    d = rng.uniform(0.01, 0.02, (8, 2)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.2, -0.1, (8, 2)).astype(np.float16).astype(np.float32)
    codes = rng.integers(0, 16, (8, 64)).astype(np.float32)
    codes[:, [0, 32]], codes[:, [1, 33]] = 0, 15
    grid = codes * np.repeat(d, 32, axis=1) + np.repeat(m, 32, axis=1)
    assert np.array_equal(quantize_q(grid, 4, np.ones(64, np.float32)).dequantize(), grid)


def codes_of(artifact: Path) -> dict[str, np.ndarray]:
    import onnx

    model = onnx.load(str(artifact / "model.onnx"))
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(".codes")}


def test_export_calibrates_int4_on_the_builtin_text_or_a_given_file(tiny_llama_checkpoint, tmp_path):
    text = tmp_path / "mine.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    export_model(tiny_llama_checkpoint, tmp_path / "builtin", precision="int4", progress=False)
    export_model(tiny_llama_checkpoint, tmp_path / "file", precision="int4", calibration_text=text, progress=False)
    export_model(tiny_llama_checkpoint, tmp_path / "plain", precision="int4", calibrate=False, progress=False)
    manifests = {n: json.loads((tmp_path / n / "ortserve.json").read_text()) for n in ("builtin", "file", "plain")}
    assert manifests["builtin"]["calibration"].endswith(" tokens of built-in text")
    assert manifests["file"]["calibration"].endswith(f" tokens of {text}")
    assert manifests["plain"]["calibration"] == ""
    builtin, mine, plain = (codes_of(tmp_path / n) for n in ("builtin", "file", "plain"))
    calibrated = [name for name in plain if name.startswith(("layers.", "lm_head.")) and name.endswith(".codes")]
    assert "lm_head.codes" in calibrated and all(not np.array_equal(builtin[n], plain[n]) for n in calibrated)
    assert any(not np.array_equal(builtin[n], mine[n]) for n in calibrated)


@pytest.mark.parametrize(
    "content, message",
    [(b" \n", "the text is empty"), (b"\xff\xfe\xfa bad", "cannot read it as UTF-8 text")],
)
def test_a_bad_calibration_text_names_the_flag(content, message, tiny_llama_checkpoint, tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_bytes(content)
    with pytest.raises(ExportError, match=f"--calibration-text {text}: {message}"):
        export_model(tiny_llama_checkpoint, tmp_path / "out", precision="int4", calibration_text=text, progress=False)
    assert not (tmp_path / "out").exists()
