"""Tiny random checkpoints, one per architecture quirk, built with transformers and saved as
safetensors: at most 2 layers, hidden size 64, grouped-query heads, quirks switched on.

PagedAttention supports head sizes 32..256, so a GQA model with hidden 64 uses head_dim 32 with
4 query / 2 KV heads (Llama-style configs accept a head_dim independent of hidden / heads).
Weights get extra noise over transformers' init so norms, biases and logits are not trivial.
"""

from __future__ import annotations

from pathlib import Path

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=320,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# Phi-3's config has no head_dim field (its rope validation uses hidden / heads): 2 heads of 32, 1 KV head.
SMALL_PHI3 = {**{k: v for k, v in SMALL.items() if k != "head_dim"}, "num_attention_heads": 2, "num_key_value_heads": 1}

# case -> (model_type, config overrides). Sequences in the tests are 23 and 11 tokens long.
CASES: dict[str, tuple[str, dict]] = {
    "llama2": ("llama", dict(tie_word_embeddings=False)),
    "llama3_rope_scaling": (
        "llama",
        dict(
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "llama_linear_rope": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama_dynamic_rope": ("llama", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
    "llama_attention_bias": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "mistral_sliding_window": ("mistral", dict(sliding_window=8)),
    "qwen2_qkv_bias_tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2_sliding_layers": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3_qk_norm": ("qwen3", dict(tie_word_embeddings=False)),
    "phi3_fused_partial_rotary": (
        "phi3",
        dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
    ),
    "phi3_longrope": (
        "phi3",
        dict(
            original_max_position_embeddings=8,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0 + 0.1 * i for i in range(16)],
                long_factor=[2.0 + 0.5 * i for i in range(16)],
            ),
        ),
    ),
    "gemma_tied_mqa": ("gemma", dict(num_key_value_heads=1)),
    "gemma2_softcap_sandwich": (
        "gemma2",
        dict(
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
    ),
    "gemma3_local_global": (
        "gemma3_text",
        dict(
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,
            rope_parameters={
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
            },
        ),
    ),
    "gpt2_conv1d": (
        "gpt2",
        dict(
            n_embd=64,
            n_layer=2,
            n_head=2,
            n_positions=128,
            vocab_size=320,
            bos_token_id=1,
            eos_token_id=2,
            scale_attn_by_inverse_layer_idx=True,
        ),
    ),
}


def build_checkpoint(case: str, folder: Path, noise: float = 0.05) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides = CASES[case]
    base = {"gpt2": {}, "phi3": SMALL_PHI3}.get(model_type, SMALL)
    kwargs = {**base, **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * noise)
    model.save_pretrained(folder)
    return folder


LARGEST_DIFFS: dict[str, float] = {}  # case -> largest |logit diff| seen, for the terminal summary
