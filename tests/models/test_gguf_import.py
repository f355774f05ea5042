"""A GGUF's quantised tensors are imported exactly: every linear's MatMulQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K / Q3K /
Q2K / Q4XS initialisers dequantise, bit for bit, to what gguf's own ``dequantize()`` gives for the same tensor,
and the graph computes with those weights."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from artifact_weights import imported
from llama_gguf import llama_cpp_permute
from ortserve.export import export_model
from ortserve.export.validate import PagedRunner, random_sequences, teacher_forced_logits
from tiny_gguf import CONFIG, FORMATS, write_tiny_llama

from ortserve.artifact import load_manifest

PROMPTS = (13, 6)
# the op each format's codes go to: centred ("S": m = -middle * d, not stored) where the format's zero point is
# its codes' middle, as Q4_1's and Q5_1's float minimums are not
OPS = {
    "Q4_0": "MatMulQ4S",
    "Q4_1": "MatMulQ4",
    "Q5_0": "MatMulQ5S",
    "Q5_1": "MatMulQ5",
    "Q8_0": "MatMulQ8S",
    "IQ4_NL": "MatMulQ4NLS",
    "IQ4_XS": "MatMulQ4XS",
    "Q4_K": "MatMulQ4K",
    "Q5_K": "MatMulQ5K",
    "Q6_K": "MatMulQ6K",
    "Q3_K": "MatMulQ3K",
    "Q2_K": "MatMulQ2K",
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """``tiny_gguf(qtype, precision=None, **patch)`` -> (GGUF file, artifact), built once each."""
    built: dict[tuple, tuple[Path, Path]] = {}

    def get(qtype: str, precision: str | None = None) -> tuple[Path, Path]:
        if (qtype, precision) not in built:
            folder = tmp_path_factory.mktemp(f"{qtype}-{precision}")
            path = folder / f"tiny-{qtype}.gguf"
            if not path.exists():
                write_tiny_llama(path, qtype)
            export_model(path, folder / "artifact", precision=precision, progress=False)
            built[qtype, precision] = path, folder / "artifact"
        return built[qtype, precision]

    return get


def gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as gguf's own dequantiser gives it, [rows, cols]."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(n) for n in t.shape][::-1])
        for t in reader.tensors
    }


@pytest.mark.parametrize("qtype", FORMATS)
def test_imported_weights_dequantise_bit_exactly_to_ggufs_own(qtype, tiny_gguf):
    path, artifact = tiny_gguf(qtype)
    w = gguf_weights(path)
    rows_q = CONFIG["heads"] * CONFIG["head_dim"]
    model = onnx.load(artifact / "model.onnx", load_external_data=False)
    qkv_op = next(n.op_type for n in model.graph.node if n.name.startswith("layers.0.qkv"))
    assert qkv_op == OPS[qtype]  # codes at their width
    qkv = imported(artifact, "layers.0.qkv")
    # our rows are Hugging Face's order; llama.cpp's converter permutes Q and K rows
    expected = {
        "layers.0.qkv": (
            np.concatenate(
                [
                    llama_cpp_permute(qkv[:rows_q], CONFIG["heads"]),
                    llama_cpp_permute(qkv[rows_q : 2 * rows_q - rows_q // 2], CONFIG["kv_heads"]),
                    qkv[2 * rows_q - rows_q // 2 :],
                ]
            ),
            np.concatenate([w["blk.0.attn_q.weight"], w["blk.0.attn_k.weight"], w["blk.0.attn_v.weight"]]),
        ),
        "layers.0.o": (imported(artifact, "layers.0.o"), w["blk.0.attn_output.weight"]),
        "layers.0.gate_up": (
            imported(artifact, "layers.0.gate_up"),
            np.concatenate([w["blk.0.ffn_gate.weight"], w["blk.0.ffn_up.weight"]]),
        ),
        "layers.0.down": (imported(artifact, "layers.0.down"), w["blk.0.ffn_down.weight"]),
        "lm_head": (imported(artifact, "lm_head"), w["token_embd.weight"]),
    }
    for label, (ours, reference) in expected.items():
        assert ours.dtype == reference.dtype == np.float32 and ours.shape == reference.shape, label
        assert np.array_equal(ours, reference), f"{label}: max |diff| {np.abs(ours - reference).max()}"
    manifest = load_manifest(artifact)
    assert manifest.weight_formats == {f"{qtype} (exact)": 8}  # q, k, v, o, gate, up, down, the head
    # MatMulQ6K came with op_version 11, MatMulQ4K and Q5K with 12, the centred ops with 13, MatMulQ3K with 14,
    # MatMulQ4XS with 15, MatMulQ2K with 16
    versions = {"Q4_1": 9, "Q5_1": 9, "Q6_K": 11, "Q4_K": 12, "Q5_K": 12, "Q3_K": 14, "IQ4_XS": 15, "Q2_K": 16}
    assert manifest.op_version == versions.get(qtype, 13)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS", "Q8_0"])
def test_an_untied_embedding_is_looked_up_in_its_own_codes(qtype, tmp_path):
    """An untied GGUF (an LM head beside token_embd): the lookup gathers rows from the embedding's own
    codes, which dequantise bit for bit to gguf's, and the artifact holds no fp32 table of it."""
    path = tmp_path / "untied.gguf"
    write_tiny_llama(path, qtype, head_type="Q8_0")
    export_model(path, tmp_path / "artifact", progress=False)
    model = onnx.load(tmp_path / "artifact" / "model.onnx", load_external_data=False)
    embed = next(n for n in model.graph.node if n.name.startswith("embed") and n.op_type.startswith("Gather"))
    assert embed.op_type == OPS[qtype].replace("MatMul", "Gather")
    assert list(embed.input[:2]) == ["embed.codes", "embed.scales"]
    table, f32 = CONFIG["vocab"] * CONFIG["hidden"], onnx.TensorProto.FLOAT
    assert not [t for t in model.graph.initializer if np.prod(t.dims) == table and t.data_type == f32]
    ours, reference = imported(tmp_path / "artifact", "embed"), gguf_weights(path)["token_embd.weight"]
    assert ours.shape == reference.shape and np.array_equal(ours, reference)
    formats = {f"{qtype} (exact)": 8}  # q, k, v, o, gate, up, down, the embedding; and the Q8_0 head
    formats["Q8_0 (exact)"] = formats.get("Q8_0 (exact)", 0) + 1
    assert load_manifest(tmp_path / "artifact").weight_formats == formats


@pytest.mark.parametrize(
    "qtype,name,stored",
    [
        ("Q4_0", ".scales", np.float16),
        ("Q4_1", ".scales", np.float16),
        ("Q4_K", ".scales", np.float16),
        ("Q8_0", ".scales", np.float16),
        ("Q5_1", ".scales", np.float16),
        ("Q5_K", ".scales", np.float16),
        ("IQ4_NL", ".scales", np.float16),
        ("IQ4_XS", ".scales", np.float16),
        ("Q2_K", ".scales", np.float16),
    ],
)
def test_scales_and_minimums_are_fp16_where_fp16_holds_them_exactly(qtype, name, stored, tiny_gguf):
    """Q4_0's d and -8d, Q4_1's d and m, Q8_0's d and -128d are fp16 values, stored as such (5 bits a
    weight for Q4_1, as in the file), as are Q4_K's and Q5_K's d and -dmin per 256 columns (their 6-bit
    sub-scales and mins sit beside the codes), as is IQ4_XS's d per 256 (its ls - 32 beside the codes). Either
    way the weights stay exact (test_imported_weights_dequantise_bit_exactly_to_ggufs_own)."""
    _, artifact = tiny_gguf(qtype)
    model = onnx.load(artifact / "model.onnx", load_external_data=False)
    layers = [t for t in model.graph.initializer if t.name.startswith("layers.") and t.name.endswith(name)]
    assert layers and {onnx.helper.tensor_dtype_to_np_dtype(t.data_type) for t in layers} == {np.dtype(stored)}


def run(artifact: Path) -> list[np.ndarray]:
    sequences = random_sequences(CONFIG["vocab"] - 2, [n + 3 for n in PROMPTS], seed=3)
    return teacher_forced_logits(PagedRunner(artifact, seed=5), sequences, PROMPTS)


@pytest.mark.parametrize("qtype", FORMATS)
def test_the_graph_computes_with_the_imported_weights(qtype, tiny_gguf, tmp_path):
    """The quantised artifact (MatMulQ4 / Q5 / Q8 / Q4NL / Q6K with 16-bit activations, a GatherQ embedding)
    equals the fp32 export of the same file: to float rounding, and for 16-bit activations to their
    rounding (1e-5 to 4e-4 of the logits' range; a weight in the wrong place moves them by ~100 %)."""
    path, _ = tiny_gguf(qtype)
    _, fp32 = tiny_gguf(qtype, "fp32")
    export_model(path, tmp_path / "exact", activation_bits=16, progress=False)
    tolerance = 2e-3  # seen: 5e-5 (Q8_0), 2e-4 (IQ4_XS), 3e-4 to 1e-3 (the K-quants' large random scales)
    for ours, reference in zip(run(tmp_path / "exact"), run(fp32)):
        assert np.abs(ours - reference).max() <= tolerance * max(1.0, float(np.abs(reference).max()))


@pytest.mark.parametrize("qtype", ["IQ3_XXS"])
def test_formats_without_an_exact_form_are_requantised_and_export_says_so(qtype, tiny_gguf, caplog):
    with caplog.at_level(logging.WARNING):
        _, artifact = tiny_gguf(qtype)
    assert load_manifest(artifact).weight_formats == {f"{qtype} -> int4": 8}
    assert f"{qtype} -> int4 x 8" in caplog.text and "dequantised and quantised again" in caplog.text
