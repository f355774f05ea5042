"""Write a Llama Hugging Face checkpoint as a GGUF file, the way llama.cpp's converter lays it
out (Q/K rows permuted, F32 tensors), with a donor GGUF's tokenizer. The tests use it to make
small GGUF files whose exact weights they know."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf Q/K row order: per head, the two rotate-half blocks of
    rows become interleaved pairs."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, 2, rows // num_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_llama_gguf(checkpoint: Path, path: Path, tokenizer_donor: Path, *, name: str = "tiny llama") -> None:
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    weights = load_file(checkpoint / "model.safetensors")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)

    donor = gguf.GGUFReader(tokenizer_donor)
    for key, field in donor.fields.items():
        if key.startswith("tokenizer."):
            value = field.contents()
            if key == "tokenizer.ggml.token_type" or isinstance(value, list):
                writer.add_array(key, value)
            elif isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, bool):
                writer.add_bool(key, value)
            else:
                writer.add_uint32(key, int(value))

    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if "lm_head.weight" in weights and not config.get("tie_word_embeddings", False):
        writer.add_tensor("output.weight", weights["lm_head.weight"])
    for layer in range(config["num_hidden_layers"]):
        for hf, short in _GGUF_NAMES.items():
            weight = weights[f"model.layers.{layer}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                weight = llama_cpp_permute(weight, heads)
            elif hf == "self_attn.k_proj":
                weight = llama_cpp_permute(weight, kv_heads)
            writer.add_tensor(f"blk.{layer}.{short}.weight", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
