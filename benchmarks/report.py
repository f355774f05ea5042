"""RESULTS.md and its plots, from the records benchmarks/compare.py left in results/compare/<isa>/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from roofline import gguf_weight_bytes, hf_weight_bytes, onnx_weight_bytes, roofline_tok_s
from run_coverage import coverage, run_label, run_of
from runners import RUNNERS, llamacpp, ortserve_runner
from runners.common import (
    BENCH_DIR,
    COMPARE,
    MODELS,
    PEER_MODELS,
    WORKLOADS,
    cpu_flags,
    load_model,
    load_records,
)
from targets import targets

PLOTS = BENCH_DIR / "plots"
PRECISION_ORDER = {"int4": 0, "int8": 1, "fp32": 2}
SYSTEM_ORDER = {
    "ortserve": 0,
    "ortserve-a8": 1,
    "ortserve-ngram": 2,
    "ortserve-draft": 3,
    "ortserve-kv-fp32": 4,
    "ortserve-kv-fp16": 5,
    "ortserve-kv-int8": 6,
    "genai-static": 7,
    "genai-engine": 8,
    "llama.cpp": 9,
    "llama.cpp-ngram": 10,
    "llama.cpp-draft": 11,
    "transformers": 12,
    "ortserve-iq4xs": 13,
    "llama.cpp-iq4xs": 14,
    "ortserve-q4km": 15,
    "llama.cpp-q4km": 16,
    "ortserve-q3km": 17,
    "llama.cpp-q3km": 18,
    "ortserve-q2k": 19,
    "llama.cpp-q2k": 20,
}


def _fmt(x, digits=1):
    return "–" if x is None else f"{x:,.{digits}f}"


def _key(r):
    return (PRECISION_ORDER.get(r["precision"], 9), SYSTEM_ORDER.get(r["system"], 9))


def weight_bytes(system: str, precision: str, model_name: str) -> int | None:
    """Bytes each system's own format reads per decoded token (see roofline.py)."""
    try:
        own = getattr(RUNNERS.get(system), "weights", None)  # a variant on files of its own
        if own is not None:
            path = own(model_name, precision)
            return gguf_weight_bytes(path) if path.suffix == ".gguf" else onnx_weight_bytes(path)
        if system.startswith("ortserve"):  # its flag variants serve the same artifact (a8: the same weights)
            return onnx_weight_bytes(ortserve_runner.artifact_path(model_name, precision) / "model.onnx")
        if system.startswith("genai"):
            return onnx_weight_bytes(PEER_MODELS / model_name / f"genai-{precision}" / "model.onnx")
        if system.startswith("llama.cpp"):
            return gguf_weight_bytes(llamacpp.gguf_path(model_name, llamacpp.GGUF_TYPE[precision]))
        if system == "transformers":
            return hf_weight_bytes(load_model(model_name).hf_dir)
    except (FileNotFoundError, OSError):
        return None
    return None


def weights_of(records: list[dict]) -> Callable[[str, str, str], int | None]:
    """weight_bytes(system, precision, model) as its decode record stored it, else from the files."""
    stored = {
        (r["system"], r["precision"], r["model"]): r["metrics"].get("weight_bytes")
        for r in records
        if r["workload"] == "decode"
    }

    def lookup(system: str, precision: str, model_name: str) -> int | None:
        return stored.get((system, precision, model_name)) or weight_bytes(system, precision, model_name)

    return lookup


def cpu_lines() -> list[str]:
    """lscpu's model, core and cache lines."""
    out = subprocess.run(
        ["bash", "-c", "lscpu | grep -E 'Model name|^CPU\\(s\\)|Thread|L2|L3' | sed 's/  */ /g'"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()


def machine_section(machine: dict) -> list[str]:
    """The machine the records were measured on (machine.json, written by the run)."""
    cpu = machine.get("cpu") or cpu_lines()
    isa = machine.get("cpu_flags") or cpu_flags()
    bw = machine.get("membw", {}).get("threads", {})
    lines = ["### Machine", ""]
    lines += [f"- {c.strip()}" for c in cpu]
    lines += [f"- ISA: {', '.join(isa)}", f"- RAM: {machine.get('ram', '?')}; kernel {machine.get('kernel', '?')}"]
    for t, r in bw.items():
        lines.append(
            f"- memory bandwidth, {t} thread(s) (benchmarks/membw.py, 2 GiB arrays): "
            + ", ".join(f"{k.replace('_GBps', '')} {v:.1f} GB/s" for k, v in r.items())
        )
    lines += [f"- versions: {', '.join(f'{k} {v}' for k, v in machine.get('versions', {}).items())}", ""]
    return lines


def decode_table(records: list[dict], bandwidth: float | None) -> list[str]:
    rows = sorted([r for r in records if r["workload"] == "decode"], key=_key)
    out = [
        "| system | precision | ISA | decode tok/s | prompt tok/s (128) | weights read / token | read GB/s (before / after) | roofline tok/s | of roofline |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    weights = weights_of(records)
    for r in rows:
        m = r["metrics"]
        wb = weights(r["system"], r["precision"], r["model"])
        bw = m.get("bandwidth_GBps") or bandwidth
        roof = roofline_tok_s(bw, wb) if wb and bw else None
        frac = m.get("decode_tok_s") / roof if roof and m.get("decode_tok_s") else None
        if r["system"].endswith(("-ngram", "-draft")):
            frac = None  # several tokens per pass over the weights: no roofline share
        around = (
            f" ({_fmt(m['bandwidth_before_GBps'])} / {_fmt(m.get('bandwidth_after_GBps'))})"
            if "bandwidth_before_GBps" in m
            else ""
        )
        out.append(
            f"| {r['system']} | {r['precision']} | {r.get('isa', '?')} | {_fmt(m.get('decode_tok_s'))} | {_fmt(m.get('prompt_tok_s'))} | "
            f"{_fmt(wb / 1e6 if wb else None, 0)} MB | {_fmt(bw)}{around} | {_fmt(roof)} | {_fmt(frac * 100 if frac else None, 0)}{'%' if frac else ''} |"
        )
    return out


def prefill_table(records: list[dict]) -> list[str]:
    rows = sorted([r for r in records if r["workload"] == "prefill"], key=_key)
    out = ["| system | precision | ISA | prompt tok/s | TTFT p50 ms |", "|---|---|---|---:|---:|"]
    out += [
        f"| {r['system']} | {r['precision']} | {r.get('isa', '?')} | {_fmt(r['metrics'].get('prompt_tok_s'))} | "
        f"{_fmt(r['metrics'].get('ttft_p50_ms'), 0)} |"
        for r in rows
    ]
    return out


def serving_table(records: list[dict]) -> list[str]:
    rows = [r for r in records if r["workload"].startswith("serve-c")]
    rows.sort(key=lambda r: (_key(r), WORKLOADS[r["workload"]].concurrency))
    out = [
        "| system | precision | ISA | concurrency | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["metrics"]
        failed = f" ({m['failed']} failed)" if m.get("failed") else ""
        out.append(
            f"| {r['system']} | {r['precision']} | {r.get('isa', '?')} | {WORKLOADS[r['workload']].concurrency}{failed} | "
            f"{_fmt(m.get('output_throughput'))} | {_fmt(m.get('ttft_p50_ms'), 0)} | "
            f"{_fmt(m.get('ttft_p99_ms'), 0)} | {_fmt(m.get('tpot_p50_ms'))} |"
        )
    return out


def shared_prefix_table(records: list[dict]) -> list[str]:
    rows = sorted([r for r in records if r["workload"] == "shared-prefix"], key=_key)
    out = [
        "| system | precision | ISA | output tok/s | TTFT p50 ms | TTFT p99 ms | prefix-cache hit tokens (server) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["metrics"]
        hits = next((v for k, v in m.get("server_counters_delta", {}).items() if "prefix_cache_hits" in k), None)
        out.append(
            f"| {r['system']} | {r['precision']} | {r.get('isa', '?')} | {_fmt(m.get('output_throughput'))} | "
            f"{_fmt(m.get('ttft_p50_ms'), 0)} | {_fmt(m.get('ttft_p99_ms'), 0)} | {_fmt(hits, 0)} |"
        )
    return out


def grounded_table(records: list[dict]) -> list[str]:
    """Input-grounded text, with and without each system's n-gram speculation."""
    rows = sorted([r for r in records if r["workload"] == "grounded"], key=_key)
    out = [
        "| system | precision | ISA | output tok/s | TPOT p50 ms | TTFT p50 ms | mean output tokens | drafts kept (server) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["metrics"]
        counters = m.get("server_counters_delta", {})
        drafted = next((v for k, v in counters.items() if "num_draft_tokens" in k), None)
        kept = next((v for k, v in counters.items() if "num_accepted_tokens" in k), None)
        rate = f"{kept / drafted:.0%} of {drafted:,.0f}" if drafted and kept is not None else "–"
        out.append(
            f"| {r['system']} | {r['precision']} | {r.get('isa', '?')} | {_fmt(m.get('output_throughput'))} | {_fmt(m.get('tpot_p50_ms'))} | "
            f"{_fmt(m.get('ttft_p50_ms'), 0)} | {_fmt(m.get('mean_output_len'), 0)} | {rate} |"
        )
    return out


def plots(records: list[dict], model: str, isa: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for r in records:
        if r["workload"].startswith("serve-c"):
            series.setdefault((r["system"], r["precision"]), []).append(
                (WORKLOADS[r["workload"]].concurrency, r["metrics"])
            )
    if not series:
        return []
    # colour = system, line style and marker = precision: 12+ series never share a look
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(sorted({s for s, _ in series}))}
    styles = {"fp32": ("-", "o"), "int8": ("--", "s"), "int4": (":", "^")}
    PLOTS.mkdir(parents=True, exist_ok=True)
    made = []
    for key, label, fname in (
        ("output_throughput", "output tokens/s", "throughput"),
        ("ttft_p50_ms", "TTFT p50 (ms)", "ttft"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (system, precision), points in sorted(series.items()):
            points = sorted(p for p in points if p[1].get(key) is not None)
            if points:
                line, marker = styles.get(precision, ("-", "o"))
                ax.plot(
                    [c for c, _ in points],
                    [m[key] for _, m in points],
                    linestyle=line,
                    marker=marker,
                    color=colours[system],
                    linewidth=2.2 if system == "ortserve" else 1.4,
                    label=f"{system} {precision}",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 4, 16, 32], labels=["1", "4", "16", "32"])
        if key == "ttft_p50_ms":
            ax.set_yscale("log")
        ax.set_xlabel("concurrency (requests in flight; genai-static: batch size)")
        ax.set_ylabel(label)
        ax.set_title(f"{model} on {isa}: {label} vs concurrency (128 in / 128 out)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = PLOTS / f"{model}-{re.sub(r'[^a-z0-9]+', '-', isa.lower()).strip('-')}-{fname}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(f"![{model} {label}](plots/{path.name})")
    return made


def _portable(command: str) -> str:
    """A record's command with this checkout's paths made relative and ports made symbolic."""
    command = command.replace(str(BENCH_DIR.parent) + "/", "").replace(sys.executable, "python")
    return re.sub(r"(127\.0\.0\.1:|--port )\d+", r"\1$PORT", command)


@dataclass(frozen=True)
class IsaRun:
    """The records of the runs on one kind of CPU (results/compare/<isa>/), and that machine."""

    isa: str
    records: list[dict]
    machine: dict
    runs: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The ISA, the CPU's model name and its generation: 'AVX-512+VNNI+BF16, AMD EPYC Zen 5'."""
        names = [
            re.sub(r"\((R|TM)\)", "", line.split(":", 1)[1]).strip()
            for line in self.machine.get("cpu", [])
            if line.startswith("Model name")
        ]
        name = " ".join(filter(None, [names[0] if names else "", self.machine.get("generation", "")]))
        return f"{self.isa}, {name}" if name else self.isa

    @property
    def bandwidth(self) -> float | None:
        threads = self.machine.get("membw", {}).get("threads", {})
        return max([v for t in threads.values() for k, v in t.items() if k.startswith("read")], default=None)


def isa_runs() -> list[IsaRun]:
    """Every ISA folder with records, the most recently run first."""

    def read(path: Path, empty):
        return json.loads(path.read_text()) if path.is_file() else empty

    found = []
    for folder in sorted(COMPARE.glob("*/")):
        records = load_records(folder)
        if records:
            isa = records[0].get("isa", folder.name)
            found.append(IsaRun(isa, records, read(folder / "machine.json", {}), read(folder / "run.json", [])))
    return sorted(found, key=lambda run: max(r.get("when", "") for r in run.records), reverse=True)


def write(path: Path, parts: list[IsaRun]) -> None:
    """RESULTS.md: one part per kind of CPU measured (each a run of its own), then the tables that
    the quality and GGUF scripts wrote."""
    lines = [
        "# ortserve vs peers",
        "",
        "Generated by `python benchmarks/compare.py` on shared 2-core machines; *Reproduce* lists the runs",
        "behind the rows (a later run replaces the parts it re-measured; a target's systems share a run):",
        "compare ratios within a run, not across runs. Under *Reproduce* each row",
        "lists when it ran and the share of the CPU that other tenants took meanwhile (busy time in",
        "/proc/stat minus this benchmark's process tree): a row with a large share is slower than the",
        "machine can do. The machines change between sessions: each kind of CPU (its ISA and vendor) has its",
        "own records and its own part below, "
        + ", ".join(f"{part.label} ({len(part.records)} records)" for part in parts)
        + ".",
        "",
    ]
    lines += [
        "## Definitions",
        "",
        "- Servers (ortserve, llama.cpp's llama-server) are measured over HTTP with `ortserve bench serve`,"
        " whose metrics are defined as `vllm bench serve`'s: TTFT, TPOT = (E2EL − TTFT)/(tokens − 1), ITL per streamed chunk.",
        "- *decode*: 3 requests of 128 random tokens in, 128 out (ignore_eos), one at a time: decode tok/s = 1000 / median TPOT.",
        "- *prefill*: 3 requests of 512 tokens, 1 out: prompt tok/s = 512 / median TTFT.",
        "- *serve-cN*: 2N (at least 4) random 128/128 requests, N in flight, sent at once.",
        "- *shared-prefix*: 16 requests of 512 tokens whose first 448 are the same, 32 out, 4 in flight.",
        "- *grounded*: 4 chat requests, one at a time, asking to copy or correct a ~256-token passage; the model"
        " stops on its own (at most 320 tokens). Output repeats the prompt: where prompt-lookup speculation pays.",
        "- *-ngram* systems add n-gram speculative decoding (ortserve `--speculative ngram`, llama.cpp"
        " `--spec-type ngram-simple`); *-draft* systems add a draft model: the same checkpoint at int4 drafting for"
        " its fp32 self (ortserve `--draft-model` with its int4 artifact, 4 draft tokens; llama.cpp `--model-draft`"
        " with its Q4_0 file, 3); *-kv-fp32* / *-kv-fp16* / *-kv-int8* are ortserve with `--kv-cache-dtype`"
        " (plain ortserve has `auto`: fp16 from 2026-12-04, fp32 before); *ortserve-a8*"
        " is ortserve exported with `--activation-bits 8` (int8 activations in its quantised linears, as llama.cpp's;"
        " ortserve's default is 16); *-iq4xs* / *-q4km* / *-q3km* / *-q2k* systems serve llama.cpp's IQ4_XS / Q4_K_M / Q3_K_M /"
        " Q2_K file of the"
        " model (llama-quantize from f32 without an importance matrix): llama.cpp itself, and ortserve on its codes"
        " imported exactly.",
        "- onnxruntime-genai and transformers run in-process (no HTTP) with the same token counts and definitions;"
        " genai-static serve-cN is one static batch of N.",
        "- Roofline: decode tok/s ≤ read bandwidth / weight bytes read per token (each system's own file; see"
        " benchmarks/roofline.py). The bandwidth (the best of membw.py's read and read4 on 1 and 2 threads, 0.5 GiB arrays)"
        " swings with the neighbours' load within minutes, so it is measured right before and right after each"
        " served decode run, and the larger is used (the stricter roofline; in-process runs: after only)."
        "",
        "",
    ]
    for part in parts:
        lines += isa_part(part)
    for table in sorted((BENCH_DIR / "tables").glob("*.md")):  # quality and GGUF tables, written by their scripts
        lines += [table.read_text().rstrip(), ""]
    lines += [
        "## Reproduce",
        "",
        "```sh",
        "bash benchmarks/peers/setup.sh          # peers venv: torch, onnxruntime-genai, llama.cpp (~15 min)",
        "python benchmarks/compare.py --repeat 3 # everything, best of 3 rounds; resumable: finished parts are skipped",
        "python benchmarks/compare.py --systems ortserve llama.cpp --models qwen2.5-0.5b-shape --workloads decode serve-c16",
        "python benchmarks/compare.py --report-only   # rewrite this file from the saved records",
        "```",
        "",
    ]
    for part in parts:
        lines += reproduce_part(part)
    path.write_text("\n".join(lines))


def isa_part(part: IsaRun) -> list[str]:
    lines = [f"## On {part.label}", "", coverage(part.records, part.runs), ""]
    lines += machine_section(part.machine)
    for model in MODELS:
        recs = [r for r in part.records if r["model"] == model]
        if not recs:
            continue
        bw, name = part.bandwidth, f"{model}, {part.label}"
        lines += (
            [f"### {name}", "", "#### Targets (issue 14)", ""]
            + targets(recs, bw, weights_of(recs), lambda r: run_of(r, part.runs))
            + [""]
        )
        lines += ["#### Single-stream decode (128 in, 128 out)", ""] + decode_table(recs, bw) + [""]
        lines += ["#### Prompt processing (one 512-token prompt)", ""] + prefill_table(recs) + [""]
        lines += ["#### Serving (128 in, 128 out, random)", ""] + serving_table(recs) + [""]
        lines += plots(recs, model, part.label) + [""]
        lines += ["#### Shared prefix (512 in, 448 shared, 32 out, 4 in flight)", ""]
        lines += shared_prefix_table(recs) + [""]
        if any(r["workload"] == "grounded" for r in recs):
            lines += ["#### Input-grounded text: copy or correct a passage (speculative decoding)", ""]
            lines += grounded_table(recs) + [""]
    return lines


def reproduce_part(part: IsaRun) -> list[str]:
    lines = [f"### The runs on {part.label}", ""]
    if part.runs:
        lines += [
            f"{i}. {run_label(run)}"
            + (f"; failed parts: {'; '.join(run['failures'])}." if run.get("failures") else ", no part failed.")
            for i, run in enumerate(part.runs, 1)
        ] + [""]
    lines += [f"<details><summary>Exact command of every {part.label} row</summary>", ""]
    for r in sorted(part.records, key=lambda r: (r["model"], r["system"], r["precision"], r["workload"])):
        share = r.get("neighbour_cpu_share")
        share = f"neighbours took {share:.0%} of the CPU" if share is not None else "neighbours not measured"
        best = (
            f", best of {len(r['attempts'])}: {', '.join(_fmt(a) for a in r['attempts'])}" if r.get("attempts") else ""
        )
        lines.append(
            f"- {r['model']} / {r['system']} {r['precision']} / {r['workload']} ({r['when']}, {share}{best}): "
            f"`{_portable(r['command'])}`"
        )
    return lines + ["", "</details>", ""]
