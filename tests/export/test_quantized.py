"""int8 / int4 exports: MatMulQ8 / MatMulQ4 (d * q + m per block of 32, int8 or 16-bit activations)
computing with exactly the weights the quantiser produced, and logits that stay close to the fp32
export.

Top-1 agreement with fp32 is measured on SmolLM2 (tests/models): tiny random models have flat
output distributions, where top-1 flips on noise and says nothing about the export.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from ortserve.export import export_model
from ortserve.export.errors import ExportError
from ortserve.export.nbits import BITS, dequantize
from ortserve.export.qweight import quantize_q
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
    """The checkpoint with every linear weight replaced by its quantised-then-dequantised self;
    ``precision``: one for all, or a function of the tensor's name."""
    import shutil

    precision_of = precision if callable(precision) else lambda name: precision
    shutil.copytree(source, folder)
    tensors = load_file(source / "model.safetensors")
    for name, weight in tensors.items():
        if name.endswith(LINEAR) and weight.ndim == 2:
            w = weight.T if conv1d else weight
            w = np.ascontiguousarray(w)
            restored = quantize_q(w, BITS[precision_of(name)]).dequantize()
            tensors[name] = np.ascontiguousarray(restored.T if conv1d else restored)
    save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("activation_bits, bound", [(8, 0.03), (16, 1e-3)])
@pytest.mark.parametrize("precision", ["int8", "int5", "int4"])
@pytest.mark.parametrize("case", ["llama2", "gpt2_conv1d", "qwen2_qkv_bias_tied"])
def test_quantized_linears_compute_with_the_dequantized_weights(
    case, precision, activation_bits, bound, tiny_checkpoint, tmp_path
):
    """Codes and scales are laid out as MatMulQ4 / MatMulQ8 read them: the quantised export equals an
    fp32 export of the dequantised weights, up to their int8 (or 16-bit) activations."""
    source = tiny_checkpoint(case)
    export_model(
        source,
        tmp_path / "q",
        precision=precision,
        lm_head_precision="fp32",
        activation_bits=activation_bits,
        progress=False,
    )
    fake = fake_quantized_checkpoint(source, tmp_path / "fake", precision, conv1d=case.startswith("gpt2"))
    export_model(fake, tmp_path / "ref", progress=False)
    for ours, reference in zip(run(tmp_path / "q"), run(tmp_path / "ref")):
        assert np.abs(ours - reference).max() <= bound * np.abs(reference).max()


@pytest.mark.parametrize("precision, min_cosine, mean_cosine", [("int8", 0.998, 0.999), ("int4", 0.85, 0.95)])
@pytest.mark.parametrize("case", ["llama3_rope_scaling", "gemma3_local_global", "phi3_fused_partial_rotary"])
def test_quantized_logits_stay_close_to_fp32(case, precision, min_cosine, mean_cosine, tiny_artifact):
    """Including a tied LM head, quantised to int8."""
    for ours, fp32 in zip(run(tiny_artifact(case, precision)), run(tiny_artifact(case))):
        cosine = (ours * fp32).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(fp32, axis=-1)
        assert cosine.min() >= min_cosine and cosine.mean() >= mean_cosine


def test_int4_linears_are_matmulq4_and_the_head_matmulq8(tiny_artifact):
    """int4 layers; the LM head defaults to int8 (the most quantisation-sensitive matmul)."""
    graph = onnx.load(tiny_artifact("llama2", "int4") / "model.onnx", load_external_data=False).graph
    assert not [n for n in graph.node if n.op_type in ("Gemm", "MatMul", "MatMulNBits", "AddBlockOffsets")]
    q4 = [n for n in graph.node if n.op_type == "MatMulQ4"]
    assert sorted(n.name.split(".")[-2] for n in q4) == sorted(["down", "gate_up", "o", "qkv"] * 2)
    (head,) = [n for n in graph.node if n.op_type == "MatMulQ8"]
    assert head.name.startswith("lm_head")


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
    assert len(heads) == 1 and heads[0].op_type == "MatMulQ8"
    layers = [n for n in graph.node if n.name.startswith("layers.") and n.op_type.startswith("MatMul")]
    assert layers and {n.op_type for n in layers} == {"MatMulQ4"}


def test_tensor_precision_keeps_the_matching_linears_at_8_bits(tiny_checkpoint, tmp_path):
    """--precision int4 --tensor-precision 'v_proj|down_proj=int8': v leaves the fused qkv for a
    MatMulQ8 of its own, down is MatMulQ8, the rest MatMulQ4; and the export computes with exactly
    those weights (an fp32 export of the same mix, dequantised, up to 16-bit activations)."""
    source = tiny_checkpoint("llama3_rope_scaling")
    export_model(
        source,
        tmp_path / "mix",
        precision="int4",
        lm_head_precision="fp32",
        tensor_precision=["v_proj|down_proj=int8"],
        progress=False,
    )
    graph = onnx.load(tmp_path / "mix" / "model.onnx", load_external_data=False).graph
    ops = {n.name.split(".", 2)[2].rsplit(".", 1)[0]: n.op_type for n in graph.node if n.name.startswith("layers.0.")}
    assert (ops["qkv.0"], ops["qkv.1"], ops["down"]) == ("MatMulQ4", "MatMulQ8", "MatMulQ8")
    assert (ops["o"], ops["gate_up"]) == ("MatMulQ4", "MatMulQ4")

    def precision_of(name):
        return "int8" if "v_proj" in name or "down_proj" in name else "int4"

    fake = fake_quantized_checkpoint(source, tmp_path / "fake", precision_of, conv1d=False)
    export_model(fake, tmp_path / "ref", progress=False)
    for ours, reference in zip(run(tmp_path / "mix"), run(tmp_path / "ref")):
        assert np.abs(ours - reference).max() <= 1e-3 * np.abs(reference).max()


@pytest.mark.parametrize(
    "rule, message",
    [
        ("v_proj", "is not PATTERN=PRECISION"),
        ("v_proj=int3", "PRECISION one of fp32, int8, int5, int4"),
        ("v_proj([=int8", "is not a regular expression"),
        ("attn_v=int8", "matches no linear weight of this model; its names look like 'model.layers.0."),
    ],
)
def test_a_bad_tensor_precision_names_the_flag_and_the_fix(rule, message, tiny_checkpoint, tmp_path):
    with pytest.raises(ExportError, match="--tensor-precision") as error:
        export_model(tiny_checkpoint("llama2"), tmp_path / "a", precision="int4", tensor_precision=[rule])
    assert message in str(error.value)
    assert not (tmp_path / "a").exists()


# ---- the quantiser ---------------------------------------------------------------------------
def ort_round_to_nearest(weight: np.ndarray, bits: int) -> np.ndarray:
    """onnxruntime's own MatMulNBits quantiser (asymmetric min/max), dequantised: the reference."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    n, k = weight.shape
    packed = np.zeros((n, k // 32, 32 * bits // 8), np.uint8)
    scales = np.zeros((n, k // 32), np.float32)
    zero_points = np.zeros((n, -(-(k // 32) * bits // 8)), np.uint8)
    quantizer = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[bits]
    quantizer(packed, np.ascontiguousarray(weight.T), scales, zero_points, 32, n, k, False)
    from ortserve.export.nbits import QuantizedWeight

    return dequantize(QuantizedWeight(packed, scales, zero_points, bits), k)


@pytest.mark.parametrize("bits", [4, 8])
def test_the_scale_search_beats_round_to_nearest_on_natural_weights(bits):
    """d and m per block (fp16) searched for the least error, against onnxruntime's min/max rounding."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 512)) * rng.uniform(0.5, 2.0, (64, 1))).astype(np.float32)
    w[:, ::37] *= 4  # a few outliers per row, as real weights have
    ours = float(((quantize_q(w, bits).dequantize() - w) ** 2).mean())
    reference = float(((ort_round_to_nearest(w, bits) - w) ** 2).mean())
    assert ours < 0.95 * reference, (ours, reference)


@pytest.mark.parametrize("qtype, bits", [("Q4_0", 4), ("Q5_0", 5), ("Q8_0", 8), ("Q4_1", 4), ("Q5_1", 5)])
def test_weights_dequantised_from_llama_cpps_formats_come_back_exactly(qtype, bits):
    """A checkpoint converted from a GGUF file (symmetric Q4_0 / Q5_0 / Q8_0 or Q4_1 / Q5_1), quantised
    again at the format's width, loses nothing: gguf's own quantiser and dequantiser are the reference."""
    import gguf

    rng = np.random.default_rng(5)
    w = (rng.standard_t(5, size=(64, 256)) * 0.02).astype(np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    grid = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind).astype(np.float32)
    assert np.array_equal(quantize_q(grid, bits).dequantize(), grid)


def test_int4_recovers_weights_on_a_q4_1_grid_exactly():
    """Dequantised Q4_1 blocks (gguf's own quantiser): d and m are fp16, and the search finds them."""
    import gguf

    natural = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32)
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    grid = gguf.quants.dequantize(gguf.quants.quantize(natural, q4_1), q4_1)
    assert np.array_equal(quantize_q(grid, 4).dequantize(), grid)
