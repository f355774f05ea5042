"""How close ortserve's greedy choices are to llama.cpp's on a real GGUF, position by position.

``gguf_greedy.py`` compares whole greedy completions, where one near-tie ends the comparison. This
script asks the per-token question instead: along llama.cpp's own greedy completions of the same 8
prompts (Gemma-3-270m Q4_K_M from PyPI by default), with the context fixed to llama.cpp's tokens
(teacher forcing), how often does each computation's argmax equal the token llama.cpp generated,
and where it does not, how far apart were the two tokens in llama.cpp's own logits? Computations:

- llama.cpp itself, the whole sequence in one batch (its matrix-matrix kernels) instead of the
  token-at-a-time decode that generated the tokens: its own summation-order noise;
- ortserve's served artifact (the file's codes, 16-bit activations), prompt prefilled and the rest
  decoded a token a step, as the server does;
- the exact computation (the same weights dequantised, fp32 activations).

The gap at a disagreement is how far apart llama.cpp's own generation had the two tokens: the logit
it chose from minus its logit of the other computation's pick (always >= 0). *As close* counts the
positions whose top-2 gap in those logits is at most the largest such gap, so a disagreement can be
read against how often such near-ties occur.

    python benchmarks/gguf_margins.py        # writes benchmarks/tables/gguf_margins.md
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
from gguf_greedy import PEERS_PY, WORK, exact_artifact, gguf_and_greedy_runs
from runners.common import BENCH_DIR, kernel_isa

TABLE = BENCH_DIR / "tables" / "gguf_margins.md"


def llama_cpp_logits(path: Path, sequences: list[list[int]]) -> list[np.ndarray]:
    """llama.cpp's logits at every position, each sequence evaluated in one batch (f32 KV cache)."""
    ids, out = WORK / "margins-ids.json", WORK / "margins-llama.npz"
    ids.write_text(json.dumps(sequences))
    peer = BENCH_DIR / "peers" / "gguf_peer.py"
    subprocess.run([str(PEERS_PY), str(peer), "logits", str(path), str(ids), str(out)], check=True)
    with np.load(out) as data:
        return [data[f"arr_{i}"] for i in range(len(sequences))]


def ortserve_logits(artifact: Path, sequences: list[list[int]], prompt_lens: list[int]) -> list[np.ndarray]:
    """Prompt prefilled, then one token a step, as the server runs a request."""
    from ortserve.export.validate import PagedRunner, teacher_forced_logits

    return teacher_forced_logits(PagedRunner(artifact, num_blocks=256), sequences, prompt_lens)


def served_artifact(path: Path) -> Path:
    """The artifact ``ortserve serve FILE.gguf`` runs (gguf_greedy.py's cache; exported if missing)."""
    os.environ["ORTSERVE_CACHE_DIR"] = str(WORK / "cache")
    from ortserve.artifact import DEFAULT_ACTIVATION_BITS
    from ortserve.engine.core import resolve_artifact

    return resolve_artifact(str(path), None, DEFAULT_ACTIVATION_BITS)


def chosen_from(path: Path, runs: list[dict]) -> list[np.ndarray]:
    """The logits llama.cpp's generation chose each token from (gguf_peer.py greedy's OUT.npz)."""
    with np.load(WORK / f"{path.stem}.llama.npz") as data:
        rows = [data[f"arr_{i}"] for i in range(len(runs))]
    for run, row in zip(runs, rows):  # its own argmax, unless a tie went to the other token
        assert [int(np.argmax(r)) for r in row] == run["ids"] or len(row) != len(run["ids"])
    return rows


def compare(reference: list[np.ndarray], other: list[np.ndarray], runs: list[dict]) -> dict:
    """The argmax of ``other`` at each generated position against the token generated there; the
    gaps in ``reference`` (what the generation chose from) where they differ."""
    agree, gaps = 0, []
    for run, ref, logits in zip(runs, reference, other):
        start = len(run["prompt_ids"]) - 1  # the row that predicts the first generated token
        for k, token in enumerate(run["ids"]):
            pick = int(np.argmax(logits[start + k]))
            if pick == token:
                agree += 1
            else:
                gaps.append(float(ref[k][token] - ref[k][pick]))
    return {"agree": agree, "gaps": gaps}


def top2_gaps(reference: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.diff(np.sort(ref, axis=1)[:, -2:], axis=1)[:, 0] for ref in reference])


def main() -> int:
    args, path, runs = gguf_and_greedy_runs(__doc__.split("\n\n")[0])
    sequences = [r["prompt_ids"] + r["ids"][:-1] for r in runs]  # the last token predicts nothing we check
    prompt_lens = [len(r["prompt_ids"]) for r in runs]
    reference = chosen_from(path, runs)
    computations = {
        "llama.cpp, the sequence in one batch": llama_cpp_logits(path, sequences),
        "ortserve, served artifact (16-bit activations)": ortserve_logits(
            served_artifact(path), sequences, prompt_lens
        ),
        "exact (dequantised weights, fp32 activations)": ortserve_logits(exact_artifact(path), sequences, prompt_lens),
    }
    near = top2_gaps(reference)
    total = sum(len(r["ids"]) for r in runs)
    lines = [
        "## A real GGUF, token by token: greedy choices beside llama.cpp's",
        "",
        f"`python benchmarks/gguf_margins.py` on {kernel_isa()}: {path.name}, llama.cpp's greedy completions of "
        f"gguf_greedy.py's {len(runs)} prompts ({total} generated tokens, at most {args.max_tokens} each), "
        "each computation teacher-forced on llama.cpp's tokens. *agrees*: its argmax is the token llama.cpp "
        "generated. *gaps*: at each disagreement, in the logits llama.cpp's generation chose from, its token's "
        "logit minus the other pick's. *as close*: positions whose top-2 gap in those logits is at most the "
        "largest such gap.",
        "",
        "| computation | agrees | gaps at the disagreements (logits) | as close |",
        "|---|---:|---|---:|",
    ]
    for label, logits in computations.items():
        result = compare(reference, logits, runs)
        gaps = sorted(result["gaps"])
        worst = max(gaps, default=0.0)
        close = int((near <= worst).sum()) if gaps else 0
        shown = ", ".join(f"{g:.3f}" for g in gaps) or "-"
        lines.append(f"| {label} | {result['agree']} of {total} | {shown} | {close} of {total} |")
    lines += [
        "",
        f"llama.cpp's own top-2 gap over the {total} positions: median {np.median(near):.2f}, "
        f"{int((near < 0.1).sum())} below 0.1, {int((near < 0.5).sum())} below 0.5.",
    ]
    TABLE.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
