"""int8 / int4 exports: MatMulNBits (block 32, accuracy level 4) computing with exactly the
weights the quantiser produced, and logits that stay close to the fp32 export.

Top-1 agreement with fp32 is measured on SmolLM2 (tests/models): tiny random models have flat
output distributions, where top-1 flips on noise and says nothing about the export.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from ortserve.export import export_model
from ortserve.export.quantize import BITS, dequantize, quantize
from ortserve.export.validate import PagedRunner, random_sequences, teacher_forced_logits
from safetensors.numpy import load_file, save_file

PROMPTS = (19, 7)
LINEAR = (
    ".q_proj.weight",
    ".k_proj.weight",
    ".v_proj.weight",
    ".o_proj.weight",
    ".gate_proj.weight",
    ".up_proj.weight",
    ".down_proj.weight",
    ".c_attn.weight",
    ".c_proj.weight",
    ".c_fc.weight",
)


def run(artifact, vocab=320):
    sequences = random_sequences(vocab, [n + 4 for n in PROMPTS], seed=2)
    return teacher_forced_logits(PagedRunner(artifact, seed=8), sequences, PROMPTS)


def fake_quantized_checkpoint(source, folder, precision, conv1d):
    """The checkpoint with every linear weight replaced by dequantize(quantize(weight))."""
    import shutil

    shutil.copytree(source, folder)
    tensors = load_file(source / "model.safetensors")
    for name, weight in tensors.items():
        if name.endswith(LINEAR) and weight.ndim == 2:
            w = weight.T if conv1d else weight
            restored = dequantize(quantize(np.ascontiguousarray(w), BITS[precision]), w.shape[1])
            tensors[name] = np.ascontiguousarray(restored.T if conv1d else restored)
    save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("case", ["llama2", "gpt2_conv1d", "qwen2_qkv_bias_tied"])
def test_quantized_linears_compute_with_the_dequantized_weights(case, precision, tiny_checkpoint, tmp_path):
    """Packing, scales and zero points are laid out as MatMulNBits reads them: the quantised
    export equals an fp32 export of the dequantised weights, up to accuracy level 4's int8
    activations."""
    source = tiny_checkpoint(case)
    export_model(source, tmp_path / "q", precision=precision, lm_head_precision="fp32", progress=False)
    fake = fake_quantized_checkpoint(source, tmp_path / "fake", precision, conv1d=case.startswith("gpt2"))
    export_model(fake, tmp_path / "ref", progress=False)
    for ours, reference in zip(run(tmp_path / "q"), run(tmp_path / "ref")):
        assert np.abs(ours - reference).max() <= 0.03 * np.abs(reference).max()


@pytest.mark.parametrize("precision, min_cosine, mean_cosine", [("int8", 0.998, 0.999), ("int4", 0.85, 0.95)])
@pytest.mark.parametrize("case", ["llama3_rope_scaling", "gemma3_local_global", "phi3_fused_partial_rotary"])
def test_quantized_logits_stay_close_to_fp32(case, precision, min_cosine, mean_cosine, tiny_artifact):
    """Including a tied LM head, quantised to int8."""
    for ours, fp32 in zip(run(tiny_artifact(case, precision)), run(tiny_artifact(case))):
        cosine = (ours * fp32).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(fp32, axis=-1)
        assert cosine.min() >= min_cosine and cosine.mean() >= mean_cosine


def test_every_linear_is_matmulnbits_with_block_32_and_int8_compute(tiny_artifact):
    """int4 layers; the LM head defaults to int8 (the most quantisation-sensitive matmul)."""
    graph = onnx.load(tiny_artifact("llama2", "int4") / "model.onnx", load_external_data=False).graph
    assert not [n for n in graph.node if n.op_type in ("Gemm", "MatMul")]
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the LM head
    for node in nbits:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        bits = 8 if node.name.startswith("lm_head") else 4
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (bits, 32, 4)


def test_lm_head_precision_is_chosen_separately(tiny_checkpoint, tmp_path):
    export_model(
        tiny_checkpoint("llama3_rope_scaling"),
        tmp_path / "a",
        precision="int4",
        lm_head_precision="int8",
        progress=False,
    )
    graph = onnx.load(tmp_path / "a" / "model.onnx", load_external_data=False).graph
    heads = [n for n in graph.node if n.name.startswith("lm_head")]
    assert len(heads) == 1 and heads[0].op_type == "MatMulNBits"
    assert {a.name: a.i for a in heads[0].attribute}["bits"] == 8
    layers = [n for n in graph.node if n.op_type == "MatMulNBits" and not n.name.startswith("lm_head")]
    assert layers and all({a.name: a.i for a in n.attribute}["bits"] == 4 for n in layers)


# ---- weights that are already on a GGUF grid are kept exactly ---------------------------------
def q4_1_grid(w: np.ndarray) -> np.ndarray:
    """What a Q4_1 GGUF block dequantises to: lo + d * q, q in 0..15, d and lo in float16."""
    blocks = w.reshape(w.shape[0], -1, 32)
    lo = blocks.min(-1).astype(np.float16).astype(np.float32)
    d = ((blocks.max(-1) - lo) / 15).astype(np.float16).astype(np.float32)
    q = np.clip(np.round((blocks - lo[..., None]) / d[..., None]), 0, 15)
    return (lo[..., None] + q * d[..., None]).reshape(w.shape).astype(np.float32)


def q8_0_grid(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, 32)
    d = (np.abs(blocks).max(-1) / 127).astype(np.float16).astype(np.float32)
    return (np.round(blocks / d[..., None]) * d[..., None]).reshape(w.shape).astype(np.float32)


def q4_0_grid(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, 32)
    signed_max = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    d = (signed_max / -8).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(blocks / d[..., None]) + 8, 0, 15)
    return ((q - 8) * d[..., None]).reshape(w.shape).astype(np.float32)


@pytest.mark.parametrize("grid, bits", [(q8_0_grid, 8), (q4_0_grid, 4)])
def test_symmetric_grids_are_kept_exactly(grid, bits):
    from ortserve.export.quantize import symmetric_grid

    w = grid(np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32))
    q = quantize(w, bits)
    np.testing.assert_allclose(dequantize(q, 96), w, rtol=0, atol=1e-6)
    assert symmetric_grid(np.random.default_rng(1).standard_normal((48, 96)).astype(np.float32), bits) is None


def test_q4_1_grid_is_codes_with_integer_zero_points_and_a_small_block_residual():
    from ortserve.export.quantize import append_residual_blocks, offset_grid, on_offset_grid

    rng = np.random.default_rng(0)
    w = q4_1_grid(rng.standard_normal((48, 96)).astype(np.float32))
    assert on_offset_grid(w[:8]) and not on_offset_grid(rng.standard_normal((8, 96)).astype(np.float32))
    assert not on_offset_grid(q4_0_grid(rng.standard_normal((8, 96)).astype(np.float32)))
    q = offset_grid(w, 4)
    np.testing.assert_allclose(dequantize(q, 96), w, rtol=0, atol=1e-6)
    assert (np.abs(q.residual) <= q.scales / 2 + 1e-7).all()  # the integer zero point takes the rest
    # what the graph computes: the residual as int4 blocks over the block sums, within 1/30 of a step
    step = q.scales.max(axis=1, keepdims=True)
    assert (np.abs(dequantize(append_residual_blocks(q), 96) - w) <= step / 30 + 1e-6).all()


def test_int4_export_of_a_q4_1_checkpoint_computes_with_its_grid_weights(tiny_checkpoint, tmp_path, monkeypatch):
    """A checkpoint dequantised from a Q4_1 GGUF (Q8_0 embedding, as SmolLM2's) exports to int4
    without re-rounding its codes: with fp32 activations (accuracy level 0) it equals an fp32
    export of exactly the weights the quantiser describes (the grid, up to the int4 residual),
    and it stays close to the checkpoint's own fp32 export with the default int8 activations."""
    import shutil

    from ortserve.export import graph
    from ortserve.export.quantize import append_residual_blocks, offset_grid

    folder = shutil.copytree(tiny_checkpoint("llama3_rope_scaling"), tmp_path / "gguf_like")
    tensors = load_file(folder / "model.safetensors")
    for name, weight in tensors.items():
        if name.endswith(LINEAR):
            tensors[name] = q4_1_grid(weight)
        elif name == "model.embed_tokens.weight":
            tensors[name] = q8_0_grid(weight)
    save_file(tensors, folder / "model.safetensors")
    described = shutil.copytree(folder, tmp_path / "described")
    save_file(
        {
            name: dequantize(append_residual_blocks(offset_grid(w, 4)), w.shape[1]) if name.endswith(LINEAR) else w
            for name, w in tensors.items()
        },
        described / "model.safetensors",
    )
    export_model(folder, tmp_path / "fp32", progress=False)
    export_model(described, tmp_path / "described_fp32", progress=False)
    export_model(folder, tmp_path / "int4", precision="int4", progress=False)
    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 0)
    export_model(folder, tmp_path / "int4_fp32_compute", precision="int4", progress=False)
    nodes = onnx.load(tmp_path / "int4" / "model.onnx", load_external_data=False).graph.node
    assert sum(n.op_type == "AppendBlockSums" and n.domain == "ortserve" for n in nodes) == 2 * 4  # 4 per layer
    for ours, ref in zip(run(tmp_path / "int4_fp32_compute"), run(tmp_path / "described_fp32")):
        assert np.abs(ours - ref).max() <= 1e-4
    for ours, ref in zip(run(tmp_path / "int4"), run(tmp_path / "fp32")):
        assert np.abs(ours - ref).max() <= 0.05 * np.abs(ref).max()
