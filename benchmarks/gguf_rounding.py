"""Why greedy completions of a quantised GGUF can differ from llama.cpp's (benchmarks/gguf_greedy.py):
llama.cpp rounds every matmul's activations to 8 bits (Q8_0 blocks of 32 with fp16 scales against
Q4_0/Q5_0/Q8_0 weights, Q8_K blocks of 256 against K-quants) and computes GELU through an fp16
table. This script emulates exactly that on the file's dequantised weights (transformers, torch)
and compares with llama.cpp (llama-cpp-python, peers venv) on one sequence:

- the logits at each position, for the exact computation and for the emulated rounding;
- layer 0's V projection from llama.cpp's own normed input and from ours: the same rounding
  applied to inputs that differ by an ulp can pick the neighbouring int8 code at a near-tie.

    python benchmarks/gguf_rounding.py      # Gemma-3-270m Q4_K_M; writes benchmarks/tables/gguf_rounding.md
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_greedy import PROMPTS, WORK, gemma_file
from runners.common import BENCH_DIR, PEERS_PY, kernel_isa

TABLE = BENCH_DIR / "tables" / "gguf_rounding.md"
VEC_DOT = {"Q4_0": "q8_0", "Q5_0": "q8_0", "Q8_0": "q8_0", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k"}


def q8_0(x):
    """ggml's quantize_row_q8_0 (x86 SIMD): id = 127 / amax, round half to even, fp16 scale."""
    import torch

    blocks = x.reshape(-1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax != 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))  # not 127 * (1/amax)
    codes = torch.round(blocks * inverse)
    return (codes * (amax / 127.0).half().float()).reshape(x.shape)


def q8_k(x):
    """ggml's quantize_row_q8_K_ref: the signed extreme m, iscale = -127 / m, scale 1 / iscale."""
    import torch

    blocks = x.reshape(-1, 256)
    extreme = torch.gather(blocks, -1, blocks.abs().argmax(-1, keepdim=True))
    iscale = torch.where(extreme != 0, torch.full_like(extreme, -127.0) / extreme, torch.zeros_like(extreme))
    codes = torch.clamp(torch.round(iscale * blocks), max=127)
    return (codes * torch.where(extreme != 0, 1.0 / iscale, torch.zeros_like(extreme))).reshape(x.shape)


def gelu_fp16_table(x):
    """ggml's GELU on f32 rows (GGML_GELU_FP16): the tanh GELU of fp16(x), rounded to fp16."""
    import torch

    h = x.half().float()
    y = (0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h)))).half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def emulate_llama_cpp(model, gguf_types: dict[str, str]) -> None:
    """Round each linear's input as llama.cpp's vec_dot type for that weight does; fp16 GELU table."""
    import gguf
    import torch

    class TableGelu(torch.nn.Module):
        def forward(self, x):
            return gelu_fp16_table(x)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, len(model.model.layers))  # HF -> GGUF, gguf's own
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        kind = gguf_types["token_embd" if name == "lm_head" else names.get_name(name)]
        rounding = q8_0 if VEC_DOT[kind] == "q8_0" else q8_k
        module.register_forward_pre_hook(lambda _m, args, f=rounding: (f(args[0]),))
    for layer in model.model.layers:
        layer.mlp.act_fn = TableGelu()


def peer(*argv: str) -> None:
    subprocess.run([str(PEERS_PY), *argv], check=True, capture_output=True)


def main() -> int:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma_file()
    torch.set_num_threads(2)
    types = {t.name.removesuffix(".weight"): t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    ids = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)(PROMPTS[0])["input_ids"]
    ids_file, logits_file, tensors_file = WORK / "rounding-ids.json", WORK / "rounding.npz", WORK / "tensors.npz"
    ids_file.write_text(json.dumps([ids]))
    peer(str(BENCH_DIR / "peers" / "gguf_peer.py"), "logits", str(path), str(ids_file), str(logits_file))
    ids_file.with_suffix(".one.json").write_text(json.dumps(ids))
    peer(str(BENCH_DIR / "peers" / "llama_tensors.py"), str(path), str(ids_file.with_suffix(".one.json")),
         "attn_norm-0,Vcur-0,kq_soft_max-0,l_out-0,l_out-5", str(tensors_file))  # fmt: skip
    theirs = np.load(logits_file)["arr_0"]
    dumped = np.load(tensors_file)

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        exact = model(torch.tensor([ids])).logits[0].numpy()
        emulate_llama_cpp(model, types)
        captured = {}
        layer0 = model.model.layers[0]
        layer0.input_layernorm.register_forward_hook(lambda _m, _a, out: captured.update(x=out[0]))
        for i in (0, 5):
            model.model.layers[i].register_forward_hook(
                lambda _m, _a, out, i=i: captured.update({i: (out[0] if isinstance(out, tuple) else out)[0]})
            )
        emulated = model(torch.tensor([ids])).logits[0].numpy()
        v_weight = layer0.self_attn.v_proj.weight.double()
        their_x = torch.from_numpy(dumped["attn_norm-0"].reshape(len(ids), -1))
        their_v = dumped["Vcur-0"].reshape(len(ids), -1)
        v_from_theirs = (q8_0(their_x).double() @ v_weight.T).numpy()
        v_from_ours = (q8_0(captured["x"]).double() @ v_weight.T).numpy()
    x_gap = np.abs(captured["x"].numpy() - their_x.numpy()).max()
    layer_rows = {i: np.abs(captured[i].numpy() - dumped[f"l_out-{i}"].reshape(len(ids), -1)).max(-1) for i in (0, 5)}

    def per_position(a: np.ndarray) -> str:
        return " ".join(f"{d:.3f}" for d in np.abs(a - theirs).max(-1))

    lines = [
        "## Why greedy parity with llama.cpp breaks: its activation rounding, emulated",
        "",
        f"`python benchmarks/gguf_rounding.py` on {kernel_isa()}: {path.name}, prompt {json.dumps(PROMPTS[0])} "
        f"({len(ids)} tokens), one batch, f32 KV cache on both sides. Largest logit difference from llama.cpp at "
        "each position, over the whole vocabulary:",
        "",
        "| computation | position 0, 1, ... |",
        "|---|---|",
        f"| the file's weights, float activations | {per_position(exact)} |",
        f"| + llama.cpp's 8-bit activation rounding and fp16 GELU table, emulated | {per_position(emulated)} |",
        "",
        "Position 0 attends only to itself, and there the emulation reproduces llama.cpp. Layer 0's V projection "
        "(Q8_0 rounding of its input) by row, largest difference from llama.cpp's:",
        "",
        "| input rounded | rows 0, 1, ... |",
        "|---|---|",
        "| llama.cpp's own normed input | "
        + " ".join(f"{d:.1e}" for d in np.abs(v_from_theirs - their_v).max(-1))
        + " |",
        "| our normed input (largest difference from llama.cpp's: "
        f"{x_gap:.1e}) | " + " ".join(f"{d:.1e}" for d in np.abs(v_from_ours - their_v).max(-1)) + " |",
        "",
        "",
        "With the rounding emulated, each layer's output by position, largest difference from llama.cpp's "
        "(values reach " + ", ".join(f"{np.abs(dumped[f'l_out-{i}']).max():.0f} at layer {i}" for i in (0, 5)) + "):",
        "",
        "| layer | positions 0, 1, ... |",
        "|---|---|",
        *(f"| {i} | " + " ".join(f"{d:.1e}" for d in rows) + " |" for i, rows in layer_rows.items()),
        "",
        "The rounding rules are reproduced: from the same input, the same codes. What remains is float "
        "summation order: where an input to a rounding (an attention output, a norm) differs from llama.cpp's "
        "by an ulp and sits at a near-tie, the two take neighbouring int8 codes, and the difference grows "
        "through the layers. Greedy equality over many tokens would need ggml's own summation order in every "
        "kernel, on each ISA; an independent runtime matches llama.cpp's rounding only up to those near-ties.",
    ]
    TABLE.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
