"""Tiny GGUF files written with the gguf library, in the layout llama.cpp's converter gives a Llama:
random weights, every linear (and the tied embedding) stored in one chosen GGUF type, and a small
byte-level tokenizer (fast to convert). Quantised with ``gguf.quants.quantize`` where gguf can
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); for the K-quants and IQ formats, which gguf only dequantises,
with random blocks of valid bytes and small scales."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONFIG = dict(hidden=256, heads=8, kv_heads=4, head_dim=32, intermediate=512, layers=1, vocab=320)
QUANTISED_BY_GGUF = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
RANDOM_BLOCKS = ("Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS")
FORMATS = QUANTISED_BY_GGUF + RANDOM_BLOCKS[:7]  # the formats imported exactly
_HALF_AT = {
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "IQ3_XXS": (0,),
}  # fp16 fields


def random_blocks(rows: int, cols: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Raw K-quant or IQ4 blocks: random code and sub-scale bytes, fp16 (d, dmin) in a sane range."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for at in _HALF_AT[qtype]:
        # IQ4_XS's d is scaled by ls - 32 (up to 32) again, Q6_K's by an int8 (up to 127, against the other
        # K-quants' 6 bits) times a code up to 32 (not 15): the weights of every format in one range
        size_of_d = {"IQ4_XS": 2e-4, "Q6_K": 5e-4}.get(qtype, 2e-3)
        scale = (rng.uniform(0.2, 1.0, len(blocks)) * rng.choice([-1, 1], len(blocks)) * size_of_d).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def encode(weight: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols] float weights -> the GGUF bytes of ``qtype`` (or float32 for F32)."""
    import gguf

    if qtype == "F32":
        return np.ascontiguousarray(weight, np.float32)
    if qtype in RANDOM_BLOCKS:
        return random_blocks(*weight.shape, qtype, rng)
    return gguf.quants.quantize(np.ascontiguousarray(weight, np.float32), gguf.GGMLQuantizationType[qtype])


def _tokenizer(writer, vocab: int) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values())
    tokens += ["to"] + [f"tok{i}" for i in range(vocab - len(tokens) - 3)] + ["<s>", "</s>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 2) + [3, 3])
    writer.add_token_merges(["t o"])
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)


def write_tiny_llama(
    path: Path,
    qtype: str,
    *,
    seed: int = 0,
    embed_type: str | None = None,
    metadata: dict | None = None,
    split_max_tensors: int = 0,
    head_type: str | None = None,
) -> dict:
    """A 1-layer tied Llama GGUF; linears in ``qtype``, the embedding in ``embed_type`` (default
    ``qtype``); ``head_type``: untied, with an LM head (``output.weight``) of that type; ``metadata``:
    more keys, float or int values; ``split_max_tensors``: written as gguf's
    split shards of at most that many tensors (``<stem>-00001-of-0000N.gguf``, as llama.cpp's
    gguf-split names them). Returns its sizes."""
    import gguf

    c, rng = CONFIG, np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name("tiny llama")
    for key, value in (metadata or {}).items():
        (writer.add_float32 if isinstance(value, float) else writer.add_int32)(key, value)
    writer.add_block_count(c["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(c["hidden"])
    writer.add_feed_forward_length(c["intermediate"])
    writer.add_head_count(c["heads"])
    writer.add_head_count_kv(c["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(c["vocab"])
    writer.add_rope_dimension_count(c["head_dim"])
    _tokenizer(writer, c["vocab"])

    def add(name: str, shape: tuple[int, ...], kind: str, scale: float = 0.05) -> None:
        weight = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
        data = encode(weight, kind, rng) if len(shape) == 2 else weight
        raw = None if kind == "F32" or len(shape) == 1 else gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, data, raw_dtype=raw)

    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    add("token_embd.weight", (c["vocab"], c["hidden"]), embed_type or qtype, 0.5)
    if head_type:
        add("output.weight", (c["vocab"], c["hidden"]), head_type, 0.5)
    add("output_norm.weight", (c["hidden"],), "F32", 1.0)
    for i in range(c["layers"]):
        add(f"blk.{i}.attn_norm.weight", (c["hidden"],), "F32", 1.0)
        add(f"blk.{i}.ffn_norm.weight", (c["hidden"],), "F32", 1.0)
        for short, shape in (
            ("attn_q", (q, c["hidden"])),
            ("attn_k", (kv, c["hidden"])),
            ("attn_v", (kv, c["hidden"])),
            ("attn_output", (c["hidden"], q)),
            ("ffn_gate", (c["intermediate"], c["hidden"])),
            ("ffn_up", (c["intermediate"], c["hidden"])),
            ("ffn_down", (c["hidden"], c["intermediate"])),
        ):
            add(f"blk.{i}.{short}.weight", shape, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return c
