"""Tiny quantised Hugging Face Llama checkpoints, and their weights as an independent library reads them.

- compressed-tensors: the library's own ``apply_quantization_config`` and ``ModelCompressor`` write
  the checkpoint of a bf16 model (pack-quantized or int-quantized, as llm-compressor does after
  computing scales);
  the reference weights are the library's ``decompress`` of the saved tensors, with the scales
  widened to float64 so that its products are exact.
- AutoAWQ (GEMM): codes, zeros and scales packed here in AutoAWQ's layout; the reference weights
  are compressed-tensors' ``AutoAWQConverter`` (which vLLM's tooling uses to read AutoAWQ
  checkpoints) followed by the same ``decompress``.
- GPTQ: no library on this machine reads it (AutoGPTQ and GPTQModel need CUDA builds or a newer
  torch), so codes, zeros and scales are packed here as AutoGPTQ's ``pack`` lays them out (zero - 1
  in the v1 ``checkpoint_format``), and the reference is scale * (code - zero) of the same random
  values, before packing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CONFIG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=1,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    vocab_size=320,
    tie_word_embeddings=False,
)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _model(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()


def _modules(model) -> dict[str, object]:
    return {name: m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in LINEARS}


def write_compressed_tensors(
    folder: Path,
    *,
    bits: int = 4,
    group_size: int | None = 64,
    symmetric: bool = True,
    fp8: bool = False,
    per_tensor: bool = False,
    seed: int = 0,
    source: Path | None = None,
) -> dict[str, np.ndarray]:
    """A checkpoint in compressed-tensors' pack-quantized format (int-quantized for 8-bit per-row
    codes with int8 activations, as W8A8 checkpoints are; float-quantized with ``fp8``: FP8 E4M3
    weights per row, W8A8-FP8; ``per_tensor``: one scale a linear); returns {module: reference
    weight [N, K] float32}. ``source``: a real checkpoint to quantise (with its tokenizer files)
    instead of a random tiny Llama."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    if source is None:
        model = _model(seed)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(source).eval()
    model = model.to(torch.bfloat16)  # llm-compressor's usual input: bf16 weights, so bf16 scales
    strategy = "group" if group_size else "tensor" if per_tensor else "channel"
    kind = "float" if fp8 else "int"
    args = QuantizationArgs(num_bits=bits, type=kind, symmetric=symmetric, strategy=strategy, group_size=group_size)
    w8a8 = bits == 8 and group_size is None  # int- or float-quantized, with dynamic activations per token
    fmt = "float-quantized" if fp8 else "int-quantized" if w8a8 else "pack-quantized"
    activations = QuantizationArgs(num_bits=8, type=kind, symmetric=True, strategy="token", dynamic=True)
    scheme = QuantizationScheme(targets=["Linear"], weights=args, input_activations=activations if w8a8 else None)
    apply_quantization_config(model, QuantizationConfig(config_groups={"g": scheme}, ignore=["lm_head"], format=fmt))
    with torch.no_grad():
        for module in _modules(model).values():
            w = module.weight  # type: ignore[attr-defined]
            shape = (1, 1, -1) if per_tensor else (w.shape[0], -1, group_size or w.shape[1])
            groups = w.reshape(*shape)
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))  # type: ignore[attr-defined]
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))  # type: ignore[attr-defined]
    for module in model.modules():
        if hasattr(module, "quantization_status"):
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(str(folder))
    for name in TOKENIZER_FILES if source is not None else ():
        if (source / name).is_file():
            (folder / name).write_bytes((source / name).read_bytes())
    return _decompressed(folder, scheme, fmt)


def _decompressed(folder: Path, scheme, fmt: str) -> dict[str, np.ndarray]:
    import torch
    from compressed_tensors.compressors import (
        FloatQuantizationCompressor,
        IntQuantizationCompressor,
        PackedQuantizationCompressor,
    )
    from safetensors.torch import load_file

    compressor = {"int-quantized": IntQuantizationCompressor, "float-quantized": FloatQuantizationCompressor}.get(
        fmt, PackedQuantizationCompressor
    )
    tensors = load_file(folder / "model.safetensors")
    weights = {}
    for module in {name.rsplit(".", 1)[0] for name in tensors if name.endswith(".weight_scale")}:
        state = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == module}
        state["weight_scale"] = state["weight_scale"].to(torch.float64)  # exact products
        weights[module] = compressor.decompress(state, scheme)["weight"].to(torch.float32).numpy()
    return weights


def write_awq(folder: Path, *, group_size: int = 64, zero_point: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """A checkpoint in AutoAWQ's GEMM layout (random codes, zeros and fp16 scales); returns {module:
    reference weight [N, K] float32} as compressed-tensors' AutoAWQ converter reads it."""
    import torch
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from safetensors.torch import save_file

    model = _model(seed)
    rng = np.random.default_rng(seed)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    for name, module in _modules(model).items():
        n, k = module.weight.shape  # type: ignore[attr-defined]
        codes = rng.integers(0, 16, (k, n))  # [in, out], as AutoAWQ holds them
        zeros = rng.integers(0, 16, (k // group_size, n)) if zero_point else None
        scales = (rng.uniform(0.5, 1.5, (k // group_size, n)) * 4e-3).astype(np.float16)
        del tensors[f"{name}.weight"]
        tensors[f"{name}.qweight"] = torch.from_numpy(_awq_pack(codes))
        tensors[f"{name}.scales"] = torch.from_numpy(scales)
        if zeros is not None:
            tensors[f"{name}.qzeros"] = torch.from_numpy(_awq_pack(zeros))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    config = dict(model.config.to_dict())
    quant = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": zero_point, "version": "gemm"}
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))

    converter = AutoAWQConverter(group_size=group_size, zero_point=zero_point)
    converted = converter.process({k: v.clone() for k, v in tensors.items()})
    scheme = converter._build_quant_config().config_groups["config_group_0"]
    return _decompressed_tensors(converted, scheme)


def _decompressed_tensors(tensors: dict, scheme) -> dict[str, np.ndarray]:
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor

    weights = {}
    for module in {name.rsplit(".", 1)[0] for name in tensors if name.endswith(".weight_packed")}:
        state = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == module}
        state["weight_scale"] = state["weight_scale"].to(torch.float64)
        weights[module] = PackedQuantizationCompressor.decompress(state, scheme)["weight"].to(torch.float32).numpy()
    return weights


def _awq_pack(values: np.ndarray) -> np.ndarray:
    """[R, 8 C] nibbles -> int32 [R, C]: column 8j + (0, 2, 4, 6, 1, 3, 5, 7)[i] in bits 4i of word j."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    grouped = values.reshape(values.shape[0], -1, 8).astype(np.uint32)
    words = sum(grouped[..., order[i]] << np.uint32(4 * i) for i in range(8))
    return np.asarray(words, np.uint32).view(np.int32)


def write_gptq(
    folder: Path,
    *,
    bits: int = 4,
    group_size: int = 64,
    sym: bool = True,
    checkpoint_format: str = "gptq",
    desc_act: bool = False,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A checkpoint in GPTQ's layout (random codes, zeros and fp16 scales); returns {module: reference
    weight [N, K] float32}, scale * (code - zero) of the values before packing."""
    import torch
    from safetensors.torch import save_file

    model = _model(seed)
    rng = np.random.default_rng(seed)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    weights = {}
    top = 1 << bits
    for name, module in _modules(model).items():
        n, k = module.weight.shape  # type: ignore[attr-defined]
        groups = k // group_size
        codes = rng.integers(0, top, (k, n))  # [in, out], as GPTQ holds them
        zeros = np.full((groups, n), top // 2) if sym else rng.integers(1, top, (groups, n))
        scales = (rng.uniform(0.5, 1.5, (groups, n)) * 4e-3 * 16 / top).astype(np.float16)
        g_idx = np.arange(k) // group_size
        if desc_act:
            g_idx = rng.permutation(g_idx)
        steps = codes.astype(np.float64) - zeros[g_idx]
        weights[name] = (scales.astype(np.float64)[g_idx] * steps).T.astype(np.float32)
        stored_zeros = zeros - 1 if checkpoint_format == "gptq" else zeros
        del tensors[f"{name}.weight"]
        tensors[f"{name}.qweight"] = torch.from_numpy(_gptq_pack(codes.T, bits).T.copy())  # packed along K
        tensors[f"{name}.qzeros"] = torch.from_numpy(_gptq_pack(stored_zeros, bits))  # packed along N
        tensors[f"{name}.scales"] = torch.from_numpy(scales)
        tensors[f"{name}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    quant = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group_size,
        "sym": sym,
        "desc_act": desc_act,
        "checkpoint_format": checkpoint_format,
    }
    (folder / "config.json").write_text(json.dumps({**model.config.to_dict(), "quantization_config": quant}))
    return weights


def _gptq_pack(values: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] values -> int32 [R, C * bits / 32]: column c in bits bits * (c % p) of word c // p."""
    per_word = 32 // bits
    grouped = values.reshape(values.shape[0], -1, per_word).astype(np.uint32)
    words = sum(grouped[..., j] << np.uint32(bits * j) for j in range(per_word))
    return np.asarray(words, np.uint32).view(np.int32)
