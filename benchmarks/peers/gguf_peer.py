"""The llama.cpp side of benchmarks/gguf_parity.py, run inside benchmarks/.venv-peers:

    python gguf_peer.py checkpoints OUT_DIR BPE_TOKENIZER_DIR   # the nine tiny random HF checkpoints
    python gguf_peer.py logits MODEL.gguf IDS.json OUT.npz      # llama.cpp's logits, every position
    python gguf_peer.py hf-logits HF_DIR IDS.json OUT.npy       # transformers' logits of the checkpoint
    python gguf_peer.py greedy MODEL.gguf PROMPTS.json OUT.json N [N_BATCH]  # llama.cpp's tokens and greedy continuations

Tiny checkpoints: 2 layers, hidden 256 (K-quant blocks of 256 fit), 8 heads of 32, 4 KV heads,
intermediate 512, weights N(0, 0.1) so logits have clear winners. Families whose llama.cpp
converter needs a sentencepiece model (Gemma 1/2, Phi-3) get one trained here on a few
paragraphs; the others take SmolLM2's byte-level BPE tokenizer (llama.cpp knows its pre-tokenizer).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SIZES: dict = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4
)
GEMMA = dict(head_dim=32, query_pre_attn_scalar=32)  # llama.cpp scales queries by 1/sqrt(head_dim)
FAMILIES: dict[str, tuple[str, dict, str]] = {
    # family -> (model_type, config overrides, tokenizer kind)
    "llama": ("llama", dict(SIZES, tie_word_embeddings=False), "bpe"),
    "llama3-rope": (  # Llama 3.1's frequency scaling: llama.cpp writes it as a rope_freqs tensor
        "llama",
        dict(
            SIZES,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        "bpe",
    ),
    "mistral": ("mistral", dict(SIZES, sliding_window=None), "bpe"),
    "qwen2": ("qwen2", dict(SIZES, tie_word_embeddings=True), "bpe"),
    "qwen3": ("qwen3", dict(SIZES, head_dim=32, tie_word_embeddings=True), "bpe"),
    "phi3": ("phi3", dict(SIZES, pad_token_id=0, bos_token_id=1, eos_token_id=2, sliding_window=None), "spm"),
    "gemma": ("gemma", dict(SIZES, **GEMMA, pad_token_id=0, bos_token_id=1, eos_token_id=2), "spm"),
    "gemma2": (
        "gemma2",
        dict(SIZES, **GEMMA, sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "spm",
    ),
    "gemma3": (
        "gemma3_text",
        dict(
            SIZES,
            **GEMMA,
            num_hidden_layers=6,  # llama.cpp's (and every Gemma 3's) pattern: 5 sliding layers, then a full one
            sliding_window=16,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),
        "bpe",
    ),
    "gpt2": (
        "gpt2",
        dict(n_embd=256, n_layer=2, n_head=8, n_positions=512, n_ctx=512, bos_token_id=1, eos_token_id=2),
        "bpe",
    ),
}
TEXT = (
    "The river starts high in the mountains, where snow melts in the spring and runs down through narrow "
    "valleys. By the time it reaches the plain it is wide and slow, and farmers along its banks use the water "
    "for their fields. Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose and oxygen. Once upon a time, in a small village at the edge of a forest, there "
    "lived an old baker named Tomas. To find the area of a circle, multiply pi by the square of the radius. "
) * 20


def sentencepiece_model(folder: Path) -> int:
    """A small sentencepiece model (tokenizer.model) in ``folder``; returns its vocabulary size."""
    import sentencepiece as spm

    (folder / "corpus.txt").write_text(TEXT.replace(". ", ".\n"))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=384,
        model_type="bpe",
        unk_id=0,  # the ids transformers' LlamaTokenizer assumes
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        # llama.cpp's Phi-3 vocabulary code looks these up; Gemma's and Phi-3's chat markers
        user_defined_symbols=[
            "<|endoftext|>",
            "<|end|>",
            "<|user|>",
            "<|assistant|>",
            "<start_of_turn>",
            "<end_of_turn>",
        ],
        minloglevel=2,
    )
    (folder / "corpus.txt").unlink()
    (folder / "tokenizer.vocab").unlink()
    return 384


def checkpoints(out: Path, bpe_tokenizer: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaTokenizer

    vocab_bpe = len(json.loads((bpe_tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    for family, (model_type, overrides, kind) in FAMILIES.items():
        folder = out / family
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "spm":
            vocab = sentencepiece_model(folder)
            LlamaTokenizer(vocab_file=str(folder / "tokenizer.model")).save_pretrained(folder)
        else:
            vocab = vocab_bpe
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(bpe_tokenizer / name, folder / name)
        config = AutoConfig.for_model(model_type, vocab_size=vocab, initializer_range=0.1, **overrides)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(torch.float32)
        with torch.no_grad():
            for param in model.parameters():  # norms and biases away from their init too
                param.add_(torch.randn_like(param) * 0.05)
        model.save_pretrained(folder)
        print(f"[peer] {family}: {folder}", file=sys.stderr)


def _llama(path: Path, n_batch: int = 512):
    from llama_cpp import Llama

    f32 = 0  # GGML_TYPE_F32: an f32 KV cache, as ortserve keeps
    return Llama(
        model_path=str(path),
        logits_all=True,
        n_ctx=512,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=2,
        type_k=f32,
        type_v=f32,
        verbose=False,
    )


def logits(path: Path, ids_file: Path, out: Path) -> None:
    """Logits at every position of each sequence (a list of token-id lists) -> OUT.npz, arr_0.."""
    import numpy as np

    llm = _llama(path)
    results = []
    for ids in json.loads(ids_file.read_text()):
        llm.reset()
        llm.eval(ids)
        results.append(np.array(llm.scores[: len(ids)], dtype=np.float32))  # a copy: the next eval reuses the rows
    np.savez(out, *results)


def hf_logits(folder: Path, ids_file: Path, out: Path) -> None:
    """transformers' logits (fp32, eager attention) of the checkpoint llama.cpp converted."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        scores = model(torch.tensor([json.loads(ids_file.read_text())])).logits[0]
    np.save(out, scores.numpy().astype(np.float32))


def greedy(path: Path, prompts_file: Path, out: Path, n: int, n_batch: int = 512) -> None:
    """Text prompts -> llama.cpp's token ids (BOS as the file says) and its greedy continuation
    (ids and text, at most n tokens, stopping at end-of-generation tokens); n_batch 1 evaluates the
    prompt one token at a time. OUT.npz beside OUT gets, per prompt, the logits each generated token
    was chosen from (row k: token k), as the generation computed them."""
    import llama_cpp
    import numpy as np

    llm = _llama(path, n_batch)
    results, chosen_from = [], []
    for prompt in json.loads(prompts_file.read_text()):
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.reset()
        tokens: list[int] = []
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(tokens) >= n:
                break
            tokens.append(int(token))
        text = llm.detokenize(tokens).decode("utf-8", errors="replace")
        results.append({"prompt": prompt, "prompt_ids": ids, "ids": tokens, "text": text})
        chosen_from.append(np.array(llm.scores[len(ids) - 1 : len(ids) - 1 + len(tokens)], dtype=np.float32))
    out.write_text(json.dumps(results, indent=1))
    np.savez(out.with_suffix(".npz"), *chosen_from)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "checkpoints":
        checkpoints(Path(args[0]), Path(args[1]))
    elif command == "logits":
        logits(Path(args[0]), Path(args[1]), Path(args[2]))
    elif command == "hf-logits":
        hf_logits(Path(args[0]), Path(args[1]), Path(args[2]))
    elif command == "greedy":
        greedy(Path(args[0]), Path(args[1]), Path(args[2]), int(args[3]), *map(int, args[4:5]))
    else:
        raise SystemExit(__doc__)
