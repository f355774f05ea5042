"""A random-weight checkpoint with exactly Qwen2.5-0.5B-Instruct's (or 1.5B's) shape, for benchmarks.

    python benchmarks/make_qwen_shape.py [--model qwen2.5-1.5b-shape] [--out benchmarks/results/models/<model>]

Shape: Qwen2, hidden 896, 24 layers, 14 query heads / 2 kv heads (head 64), intermediate 4864,
vocab 151936, tied embeddings, rope_theta 1e6, q/k/v biases; 494M parameters, saved fp32
(~2 GB). 1.5B: hidden 1536, 28 layers, 12 query heads / 2 kv heads (head 128), intermediate 8960;
1.54B parameters (~6.2 GB): its widths are multiples of 256, so llama-quantize's Q4_K_M makes its
linears Q4_K and Q6_K, as in most real models, where the 0.5B's fall back to Q5_0.
Weights: transformers' own initialisation under torch.manual_seed(--seed).

Tokenizer: Qwen2's tokenizer files are not available offline, so this reuses SmolLM2's byte-level
BPE vocabulary and merges (49152 tokens, ChatML template, <|im_end|> = 2) and
- pads the vocabulary to 151936 with filler tokens "Ġ<N>" (decode to " <N>"). Fillers have no
  merges, so encoding never produces them, but every id the random model can emit decodes, and
  every peer sees a tokenizer of exactly the model's vocab;
- gives tokenizer.json Qwen2's own NFC normaliser and pre-tokenizer (regex split, then byte-level),
  because transformers loads any model_type=qwen2 tokenizer as Qwen2Tokenizer, which imposes
  them: so the `tokenizers` library, transformers, onnxruntime-genai and llama.cpp (converted
  with pre-tokenizer "qwen2", see peers/convert_gguf.py) all split text the same way.
Generated text is meaningless: benchmark it with ignore_eos and fixed lengths.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

QWEN25_05B = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    use_sliding_window=False,
    bos_token_id=1,  # the borrowed tokenizer's ids, not Qwen's 151643/151645
    eos_token_id=2,
    pad_token_id=2,
)
SHAPES = {
    "qwen2.5-0.5b-shape": QWEN25_05B,
    "qwen2.5-1.5b-shape": {
        **QWEN25_05B,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "intermediate_size": 8960,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}


def default_tokenizer_source() -> Path:
    from ortserve.models import prepare_checkpoint

    return Path(prepare_checkpoint("smollm2-135m-instruct", progress=False))


def padded_tokenizer(source: Path, out: Path, vocab_size: int) -> None:
    """Copy source's tokenizer files into out, padding tokenizer.json's vocab to vocab_size."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    spec = json.loads((source / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    if max(taken) >= vocab_size:
        raise SystemExit(f"{source}: tokenizer ids reach {max(taken)}, beyond the model's vocab {vocab_size}")
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"\u0120<{i}>"] = i  # "Ġ<i>": byte-level for " <i>"
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = QWEN2_PRE_TOKENIZER
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))


def check_tokenizer(folder: Path, vocab_size: int) -> None:
    """transformers (as Qwen2Tokenizer) and the bare tokenizer.json must agree, on every kind of text."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert len(hf) == vocab_size, (len(hf), vocab_size)
    text = (
        "\n \n\n \t\t 3 33 333 3.3 I've been 'told he's there 🚀 (normal) 我想在apple工作1314151天 ------======= нещо"
    )
    assert hf.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids
    assert hf.decode([vocab_size - 1]) == f" <{vocab_size - 1}>"


def build(out: Path, seed: int, tokenizer_source: Path, shape: dict) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(seed)
    config = Qwen2Config(**shape)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(tmp)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2, do_sample=False).save_pretrained(tmp)
    padded_tokenizer(tokenizer_source, tmp, config.vocab_size)
    check_tokenizer(tmp, config.vocab_size)
    (tmp / "MODEL_CARD.md").write_text(
        f"Random weights (torch.manual_seed({seed})) in {out.name} (Qwen2.5-Instruct's shape); "
        f"tokenizer: {tokenizer_source.name}'s, padded to {config.vocab_size}. Built by benchmarks/make_qwen_shape.py.\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main() -> int:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=SHAPES, default="qwen2.5-0.5b-shape")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/models/<model>")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tokenizer-from", type=Path, default=None, help="HF dir whose tokenizer to pad (default: SmolLM2's)"
    )
    p.add_argument("--force", action="store_true", help="rebuild even if --out exists")
    args = p.parse_args()
    target = args.out or here / "results" / "models" / args.model
    if (target / "config.json").is_file() and not args.force:
        print(f"exists: {target}")
        return 0
    out = build(target, args.seed, args.tokenizer_from or default_tokenizer_source(), SHAPES[args.model])
    n = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {out} ({n / 1e9:.2f} GB of weights)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
