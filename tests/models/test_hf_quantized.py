"""Quantised Hugging Face checkpoints (compressed-tensors, AutoAWQ, GPTQ) export with their own codes:
every linear's MatMulQ4 / MatMulQ8 initialisers dequantise, bit for bit, to the reference weights of
the same files (compressed-tensors' own decompression; for GPTQ, which no library here reads, the
values before packing: quantized_checkpoints.py), and the artifact's logits equal transformers' on
those weights. Other quantisation methods are refused with what to do instead."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from artifact_weights import imported
from ortserve.export import export_model
from ortserve.export.errors import ExportError
from ortserve.export.validate import PagedRunner, random_sequences, teacher_forced_logits
from quantized_checkpoints import CONFIG, write_awq, write_compressed_tensors, write_gptq

from ortserve.artifact import load_manifest

CHECKPOINTS = {  # name -> (writer, options, what the manifest calls each linear)
    "w4a16-g64": (write_compressed_tensors, dict(bits=4, group_size=64), "compressed-tensors int4 g64 (exact)"),
    "w4a16-g128-asym": (
        write_compressed_tensors,
        dict(bits=4, group_size=128, symmetric=False),
        "compressed-tensors int4 g128 (exact)",
    ),
    "w8a16-g32-asym": (
        write_compressed_tensors,
        dict(bits=8, group_size=32, symmetric=False),
        "compressed-tensors int8 g32 (exact)",
    ),
    "w8a8-per-row": (
        write_compressed_tensors,
        dict(bits=8, group_size=None),
        "compressed-tensors int8 per-row (exact)",
    ),
    "w8a8-per-tensor-asym": (
        write_compressed_tensors,
        dict(bits=8, group_size=None, per_tensor=True, symmetric=False),
        "compressed-tensors int8 per-row (exact)",
    ),
    "awq-g64": (write_awq, dict(group_size=64), "awq int4 g64 (exact)"),
    "awq-g128-no-zeros": (write_awq, dict(group_size=128, zero_point=False), "awq int4 g128 (exact)"),
    "gptq-4bit-g64-sym": (write_gptq, dict(bits=4, group_size=64), "gptq int4 g64 (exact)"),
    "gptq-4bit-g128-asym": (write_gptq, dict(bits=4, group_size=128, sym=False), "gptq int4 g128 (exact)"),
    "gptq-8bit-g32-v2": (
        write_gptq,
        dict(bits=8, group_size=32, sym=False, checkpoint_format="gptq_v2"),
        "gptq int8 g32 (exact)",
    ),
}
PROMPT, LENGTH = 12, 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``checkpoint(name)`` -> (folder, reference weights, artifact), built once each."""
    built: dict[str, tuple[Path, dict[str, np.ndarray], Path]] = {}

    def get(name: str) -> tuple[Path, dict[str, np.ndarray], Path]:
        if name not in built:
            writer, options, _ = CHECKPOINTS[name]
            folder = tmp_path_factory.mktemp(name)
            weights = writer(folder / "hf", **options)
            export_model(folder / "hf", folder / "artifact", progress=False)
            built[name] = folder / "hf", weights, folder / "artifact"
        return built[name]

    return get


def transformers_logits(folder: Path, weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The checkpoint's Llama in transformers, with the reference weights in its linears."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "quantization_config"}
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    state = model.state_dict()
    from safetensors.torch import load_file

    floats = {k: v for k, v in load_file(folder / "model.safetensors").items() if k in state and v.is_floating_point()}
    floats.update({f"{module}.weight": torch.from_numpy(w) for module, w in weights.items()})
    model.load_state_dict({**state, **floats})
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_linears_import_bit_exactly_to_compressed_tensors_own_decompression(name, checkpoint):
    _, weights, artifact = checkpoint(name)
    layer = "model.layers.0"
    expected = {
        "layers.0.qkv": np.concatenate([weights[f"{layer}.self_attn.{p}_proj"] for p in "qkv"]),
        "layers.0.o": weights[f"{layer}.self_attn.o_proj"],
        "layers.0.gate_up": np.concatenate([weights[f"{layer}.mlp.gate_proj"], weights[f"{layer}.mlp.up_proj"]]),
        "layers.0.down": weights[f"{layer}.mlp.down_proj"],
    }
    for label, reference in expected.items():
        ours = imported(artifact, label)
        assert ours.shape == reference.shape, label
        assert np.array_equal(ours, reference), f"{label}: max |diff| {np.abs(ours - reference).max()}"
    assert load_manifest(artifact).weight_formats == {CHECKPOINTS[name][2]: 7, "fp32": 1}  # the LM head is float


@pytest.mark.parametrize("name", ["w4a16-g128-asym", "w8a8-per-row", "awq-g64", "gptq-4bit-g128-asym"])
def test_logits_equal_transformers_on_the_decompressed_weights(name, checkpoint, tmp_path):
    folder, weights, artifact = checkpoint(name)
    ids = random_sequences(CONFIG["vocab_size"], [LENGTH], seed=1)[0]
    reference = transformers_logits(folder, weights, ids)
    fp32 = tmp_path / "fp32"
    export_model(folder, fp32, precision="fp32", progress=False)
    for path, tolerance in ((artifact, 2e-3), (fp32, 1e-4)):  # 16-bit activations; fp32 throughout
        ours = teacher_forced_logits(PagedRunner(path, seed=3), [ids], [PROMPT])[0]
        scale = max(1.0, float(np.abs(reference).max()))
        assert np.abs(ours - reference).max() <= tolerance * scale, path.name


def test_fp8_weights_are_read_exactly_and_kept_at_8_bits(tmp_path):
    """compressed-tensors' float-quantized (W8A8-FP8): no integer form, so the weights are read as
    compressed-tensors decompresses them, bit for bit, and stored as int8 unless a precision is given."""
    from ortserve.export.checkpoint import Checkpoint
    from ortserve.export.hf_quantized import QuantizedCheckpoint

    weights = write_compressed_tensors(tmp_path / "hf", bits=8, group_size=None, fp8=True)
    settings = json.loads((tmp_path / "hf" / "config.json").read_text())["quantization_config"]
    source = QuantizedCheckpoint(Checkpoint(tmp_path / "hf"), "compressed-tensors", settings)
    for module, reference in weights.items():
        assert np.array_equal(source.read(f"{module}.weight"), reference), module
    export_model(tmp_path / "hf", tmp_path / "int8", progress=False)
    assert load_manifest(tmp_path / "int8").weight_formats == {"compressed-tensors fp8 per-row -> int8": 7, "fp32": 1}
    ids = random_sequences(CONFIG["vocab_size"], [LENGTH], seed=1)[0]
    reference = transformers_logits(tmp_path / "hf", weights, ids)
    scale = max(1.0, float(np.abs(reference).max()))
    export_model(tmp_path / "hf", tmp_path / "fp32", precision="fp32", progress=False)
    for artifact, tolerance in ((tmp_path / "fp32", 1e-4), (tmp_path / "int8", 2e-2)):  # int8: its rounding
        ours = teacher_forced_logits(PagedRunner(artifact, seed=3), [ids], [PROMPT])[0]
        assert np.abs(ours - reference).max() <= tolerance * scale, artifact.name


@pytest.mark.slow
def test_smollm2_quantised_by_compressed_tensors_serves_its_own_weights(smollm2_checkpoint, tmp_path):
    """The real model, W4A16 in groups of 64 as llm-compressor would write it (576 columns: 128 does
    not divide them): its logits are transformers' on the decompressed weights, and it answers."""
    from ortserve import LLM, SamplingParams

    weights = write_compressed_tensors(tmp_path / "hf", bits=4, group_size=64, source=smollm2_checkpoint)
    export_model(tmp_path / "hf", tmp_path / "artifact", progress=False)
    assert load_manifest(tmp_path / "artifact").weight_formats["compressed-tensors int4 g64 (exact)"] == 210
    ids = random_sequences(49152, [40], seed=2)[0]
    reference = transformers_logits(tmp_path / "hf", weights, ids)
    ours = teacher_forced_logits(PagedRunner(tmp_path / "artifact", seed=3), [ids], [20])[0]
    assert np.abs(ours - reference).max() <= 2e-3 * float(np.abs(reference).max())  # seen: 2.4e-4
    assert (ours.argmax(-1) == reference.argmax(-1)).mean() >= 0.95
    llm = LLM(str(tmp_path / "artifact"), kv_cache_space=0.1)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    [out] = llm.chat(question, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)
    assert "Paris" in out.outputs[0].text


def test_groups_smaller_than_a_block_are_quantised_again_and_export_says_so(tmp_path, caplog):
    write_compressed_tensors(tmp_path / "hf", bits=4, group_size=16)
    with caplog.at_level(logging.WARNING):
        export_model(tmp_path / "hf", tmp_path / "artifact", progress=False)
    formats = load_manifest(tmp_path / "artifact").weight_formats
    assert formats == {"compressed-tensors int4 g16 -> int4": 7, "fp32": 1}
    assert "compressed-tensors int4 g16 -> int4 x 7" in caplog.text


@pytest.mark.parametrize(
    "quantization_config,named",
    [
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "quant_method 'gptq' (bits 3)"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "quant_method 'awq' (version 'gemv'"),
        (
            {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
            "compressed-tensors format nvfp4-pack-quantized",
        ),
    ],
)
def test_other_quantisation_methods_are_refused_with_the_alternative(quantization_config, named, tmp_path):
    write_awq(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    with pytest.raises(ExportError) as error:
        export_model(tmp_path / "hf", tmp_path / "artifact", progress=False)
    assert named in str(error.value) and "Export the unquantised checkpoint" in str(error.value)


def test_gptq_symmetric_zeros_are_stored_as_real_checkpoints_store_them(tmp_path):
    """The fixture's layout against a fact of published GPTQ checkpoints: a symmetric 4-bit v1 file's
    qzeros are all 0x77777777 (zero 8, stored as 8 - 1 in each nibble)."""
    from safetensors.numpy import load_file

    write_gptq(tmp_path, bits=4, sym=True)
    qzeros = load_file(tmp_path / "model.safetensors")["model.layers.0.self_attn.q_proj.qzeros"]
    assert qzeros.dtype == np.int32 and (qzeros == 0x77777777).all()


def test_gptq_act_order_is_refused_with_the_alternative(tmp_path):
    write_gptq(tmp_path / "hf", desc_act=True)
    with pytest.raises(ExportError, match="desc_act.*export the unquantised checkpoint"):
        export_model(tmp_path / "hf", tmp_path / "artifact", progress=False)
