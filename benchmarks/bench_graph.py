"""Graph-level speed: an ortserve artifact next to onnxruntime-genai's model of the same checkpoint,
both run by plain onnxruntime in this process (same version, same session options), no engine,
server or sampler in the way.

Workloads (batch 1, random token ids):
  decode   a --context-token prompt is prefilled, then --steps single-token steps are timed one
           by one; tok/s = 1000 / median step ms
  prefill  one --prefill-token prompt into an empty cache; tok/s = tokens / seconds
Decode steps interleave the graphs step by step and prefills round by round, so a noisy neighbour
hits all alike; figures are medians, with the fast end in brackets (10th-percentile step, best
prefill), and ratios compare numbers of this one run. The "cpu" column is decode by the calling
thread's CPU time: with one intra-op thread ORT computes on that thread, so it leaves out the
time other processes held the core (the steadiest figure on a shared machine). --threads takes
several values (e.g. 1 2 2ns, ns = no spinning) and times every graph at each; --sessions N
builds N sessions per graph, since a session's memory placement alone moves it by a few %.
A roofline table follows: read bandwidth measured now (benchmarks/membw.py) / weight bytes read
per decode step (benchmarks/roofline.py).

ortserve: artifact inputs as the engine feeds them (export/validate.py PagedRunner: flattened
batch, paged KV bound once through IOBinding). genai: its model.onnx (GroupQueryAttention) with
past and present KV sharing one buffer per layer through IOBinding, as its runtime does; its
graph computes logits for every prompt position, ours only for the last.

--profile adds ORT's profiler (one more session per graph, not interleaved): per-op time of a
decode step and of the prefill, node counts, and the time between kernels (the profiler itself
adds about 3 us per node there). --profile-batch N profiles decode steps of N sequences instead
(ortserve artifacts only), as a c16 server runs them.

    python benchmarks/bench_graph.py                                  # smollm2 int4 and fp32
    python benchmarks/bench_graph.py --precision int4 --threads 1 2 2ns --profile
    python benchmarks/bench_graph.py --sessions 2 --artifact old=/tmp/old-{precision} --artifact new=/tmp/new-{precision}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
from graph_profile import print_profiles, profile

from ortserve.artifact import PRECISIONS

BENCH_DIR = Path(__file__).resolve().parent
PEER_NAMES = {"smollm2-135m-instruct": "smollm2-135m"}  # built-in model -> benchmarks/runners name


def session_options(
    threads: int, spin: bool, profile_prefix: str | None = None, shared: bool = False
) -> ort.SessionOptions:
    """``shared``: other sessions run between this one's runs, so its pool threads stop spinning
    when a run ends (``session.force_spinning_stop``). Left spinning, they take the cores from the
    next session's run: SmolLM2 int4 decode timed beside a copy of itself ran at 88-92 tok/s, alone
    at 140-153 (2 threads, AMD EPYC Zen 4, 2026-12-03)."""
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if shared:
        o.add_session_config_entry("session.force_spinning_stop", "1")
    if profile_prefix:
        o.enable_profiling = True
        o.profile_file_prefix = profile_prefix
    return o


class OrtserveGraph:
    """Sequences through an ortserve artifact, fed as the engine feeds them (one, unless a profile
    asks for a batch)."""

    def __init__(self, label: str, artifact: Path, options: ort.SessionOptions, max_tokens: int):
        from ortserve.export.validate import PagedRunner

        self.label, self.path = label, artifact
        self.runner = PagedRunner(artifact, num_blocks=-(-max_tokens // 16) + 4, options=options)
        self.session = self.runner.session
        self.weight_bytes = _weight_bytes(artifact / "model.onnx")
        self.sequences: set[int] = set()

    def reset(self) -> None:
        for seq in self.sequences:
            self.runner.release(seq)
        self.sequences.clear()

    def step(self, tokens: list[int], seq: int = 0) -> None:
        self.step_batch([(seq, tokens)])

    def step_batch(self, batch: list[tuple[int, list[int]]]) -> None:
        self.sequences.update(seq for seq, _ in batch)
        self.runner.step(batch)


class GenaiGraph:
    """One sequence through onnxruntime-genai's model.onnx: past/present KV share one buffer."""

    def __init__(self, label: str, model_dir: Path, options: ort.SessionOptions, max_tokens: int):
        self.label, self.path = label, model_dir
        config = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
        self.session = ort.InferenceSession(
            str(model_dir / config["filename"]), options, providers=["CPUExecutionProvider"]
        )
        shape = (1, config["num_key_value_heads"], max_tokens, config["head_size"])
        names = config["inputs"], config["outputs"]
        self.binding = self.session.io_binding()
        self.caches = []
        for layer in range(config["num_hidden_layers"]):
            for past, present in (("past_key_names", "present_key_names"), ("past_value_names", "present_value_names")):
                value = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                self.binding.bind_ortvalue_input(names[0][past] % layer, value)
                self.caches.append((names[1][present] % layer, value))
        self.input_ids, self.mask = names[0]["input_ids"], names[0]["attention_mask"]
        self.logits = names[1]["logits"]
        self.length = 0
        self.weight_bytes = _weight_bytes(model_dir / config["filename"])

    def reset(self) -> None:
        self.length = 0

    def step(self, tokens: list[int]) -> None:
        self.length += len(tokens)
        self.binding.bind_cpu_input(self.input_ids, np.array([tokens], np.int64))
        self.binding.bind_cpu_input(self.mask, np.ones((1, self.length), np.int64))
        self.binding.clear_binding_outputs()
        self.binding.bind_output(self.logits, "cpu")
        for name, value in self.caches:
            self.binding.bind_ortvalue_output(name, value)
        self.session.run_with_iobinding(self.binding)


def _weight_bytes(model_path: Path) -> int:
    sys.path.insert(0, str(BENCH_DIR))
    from roofline import onnx_weight_bytes

    return onnx_weight_bytes(model_path)


# ---- workloads -------------------------------------------------------------------------------


def prefill_time(graph, prompt: list[int]) -> float:
    graph.reset()
    start = time.perf_counter()
    graph.step(prompt)
    return time.perf_counter() - start


def measure(graphs: list, context: list[int], prefill: list[int], steps: int, rounds: int) -> dict[str, dict]:
    """Decode steps interleave the graphs step by step (each keeps its own sequence, restarted
    from the context every ``steps`` steps); prefills interleave round by round."""
    for g in graphs:  # warm-up: first runs allocate and page in the weights
        prefill_time(g, prefill)
        g.reset()
        g.step(context)
        for token in context[:4]:
            g.step([token])
    decode, decode_cpu, prompt = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in range(rounds):
        for g in graphs:
            g.reset()
            g.step(context)
        for i in range(steps):
            for g in graphs[r % len(graphs) :] + graphs[: r % len(graphs)]:
                start, cpu = time.perf_counter(), time.thread_time()
                g.step([context[i % len(context)]])
                decode[g.label].append(time.perf_counter() - start)
                decode_cpu[g.label].append(time.thread_time() - cpu)
        for g in graphs:
            prompt[g.label].append(prefill_time(g, prefill))
    out = {}
    for g in {g.label: g for g in graphs}.values():
        steps_s, prompts_s = np.array(decode[g.label]), np.array(prompt[g.label])
        out[g.label] = {
            "decode_step_ms": float(np.median(steps_s)) * 1e3,
            "decode_step_ms_p10": float(np.percentile(steps_s, 10)) * 1e3,
            # this thread's CPU time: with 1 intra-op thread, the step's compute without
            # the time other processes held the core
            "decode_cpu_ms": float(np.median(decode_cpu[g.label])) * 1e3,
            "prefill_s": float(np.median(prompts_s)),
            "prefill_s_min": float(prompts_s.min()),
            "weight_bytes": g.weight_bytes,
        }
        out[g.label]["decode_tok_s"] = 1e3 / out[g.label]["decode_step_ms"]
        out[g.label]["decode_tok_s_p10"] = 1e3 / out[g.label]["decode_step_ms_p10"]
        out[g.label]["prefill_tok_s"] = len(prefill) / out[g.label]["prefill_s"]
        out[g.label]["prefill_tok_s_best"] = len(prefill) / out[g.label]["prefill_s_min"]
    return out


# ---- report ----------------------------------------------------------------------------------


def print_results(title: str, results: dict[str, dict], reference: str | None) -> None:
    """Medians, and in brackets the fast end (decode: 10th-percentile step; prefill: best round),
    which a busy neighbour disturbs less; "cpu" is decode by this thread's CPU time (meaningful
    with 1 intra-op thread, where ORT computes on the calling thread)."""
    print(f"\n## {title}")
    print(
        f"{'graph':<20}{'decode tok/s':>22}{'cpu':>7}{'prefill tok/s':>22}{'weights MB':>12}"
        + (f"{'decode ×ref':>16}{'prefill ×ref':>16}" if reference else "")
    )
    for label, r in results.items():
        suffix = label.rsplit(" ", 1)[-1] if reference and reference.endswith(" t") else ""
        ref = results.get(reference + suffix[1:]) if reference else None
        line = (
            f"{label:<20}{r['decode_tok_s']:>12.1f} ({r['decode_tok_s_p10']:>6.1f}){1e3 / r['decode_cpu_ms']:>7.1f}"
            f"{r['prefill_tok_s']:>12.1f} ({r['prefill_tok_s_best']:>6.1f}){r['weight_bytes'] / 1e6:>12.1f}"
        )
        if ref:
            line += (
                f"{r['decode_tok_s'] / ref['decode_tok_s']:>9.2f} ({r['decode_tok_s_p10'] / ref['decode_tok_s_p10']:.2f})"
                f"{r['prefill_tok_s'] / ref['prefill_tok_s']:>9.2f} ({r['prefill_tok_s_best'] / ref['prefill_tok_s_best']:.2f})"
            )
        print(line)


def print_roofline(report: dict, threads: list[int]) -> dict:
    """Decode as a share of its roofline: read bandwidth (benchmarks/membw.py, measured now, the
    best of its read kernels at each thread count) / weight bytes a decode step reads."""
    sys.path.insert(0, str(BENCH_DIR))
    import membw

    bandwidth = {}
    for t in threads:
        kernels = membw.measure(0.5, [t], 3)["threads"][str(t)]
        bandwidth[t] = max(v for k, v in kernels.items() if k.startswith("read"))
    print(
        "\n## roofline: read bandwidth now "
        + ", ".join(f"{bandwidth[t]:.1f} GB/s ({t} thread{'s' * (t > 1)})" for t in threads)
    )
    print(f"{'graph':<28}{'weights MB':>12}{'roofline tok/s':>16}{'decode tok/s':>14}{'of roofline':>13}")
    out = {"bandwidth_GBps": bandwidth, "graphs": {}}
    for entry in report["precisions"].values():
        for label, r in entry["results"].items():
            suffix = label.rsplit(" t", 1)[-1].removesuffix("ns") if " t" in label else ""
            t = int(suffix) if suffix.isdigit() else threads[-1]
            roof = bandwidth.get(t, bandwidth[threads[-1]]) * 1e9 / r["weight_bytes"]
            out["graphs"][label] = {"roofline_tok_s": roof, "fraction": r["decode_tok_s"] / roof}
            print(
                f"{label:<28}{r['weight_bytes'] / 1e6:>12.1f}{roof:>16.1f}{r['decode_tok_s']:>14.1f}"
                f"{r['decode_tok_s'] / roof:>12.0%}"
            )
    return out


# ---- which graphs ----------------------------------------------------------------------------


def genai_dir(model: str, precision: str, pattern: str | None, build: bool) -> Path | None:
    if pattern:
        path = Path(pattern.format(precision=precision))
        return path if (path / "genai_config.json").is_file() else None
    peer = PEER_NAMES.get(model, model)
    candidates = [
        BENCH_DIR / "results" / "peer-models" / peer / f"genai-{precision}",
        Path("/tmp") / "peer-models" / peer / f"genai-{precision}",
    ]
    for path in candidates:
        if (path / "genai_config.json").is_file():
            return path
    sys.path.insert(0, str(BENCH_DIR))
    from runners.common import PEERS_PY, load_model

    if not build or not PEERS_PY.is_file():
        return None
    from runners.genai import (
        model_dir,  # builds with onnxruntime-genai's model builder in the peers venv
    )

    return model_dir(load_model(peer), precision)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="built-in model name (ortserve.models)")
    p.add_argument("--precision", nargs="+", default=["int4", "fp32"], choices=PRECISIONS)
    p.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="ortserve artifact(s) to time instead of the built-in model's cached one; {precision} in DIR is replaced",
    )
    p.add_argument(
        "--genai",
        default=None,
        help="genai model dir; {precision} is replaced (default: "
        "benchmarks/results/peer-models/<model>/genai-<precision>, built if the peers venv exists)",
    )
    p.add_argument("--no-genai", action="store_true")
    p.add_argument("--no-build", action="store_true", help="do not build a missing genai model")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--threads",
        nargs="+",
        default=["1", "2"],
        help="intra-op threads, e.g. 1 2 2ns (ns: no spinning); several values time each graph at each, interleaved",
    )
    p.add_argument("--sessions", type=int, default=1, help="sessions per graph, interleaved (placement noise)")
    p.add_argument("--no-spin", action="store_true", help="session.intra_op.allow_spinning = 0")
    p.add_argument("--profile", action="store_true", help="also per-op profiles (ORT profiler)")
    p.add_argument(
        "--profile-batch",
        type=int,
        default=1,
        metavar="N",
        help="profile decode steps of N sequences at --context each (ortserve graphs only; e.g. 16 as at c16)",
    )
    p.add_argument("--no-roofline", action="store_true", help="skip the memory bandwidth measurement")
    p.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = p.parse_args()

    rng = np.random.default_rng(0)
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "onnxruntime": ort.__version__, "precisions": {}}
    max_tokens = max(args.context + args.steps + 8, args.prefill) + 16
    for precision in args.precision:
        makers = {}
        if args.artifact:
            for spec in args.artifact:
                label, _, path = spec.rpartition("=")
                makers[label or f"ortserve {precision}"] = (OrtserveGraph, Path(path.format(precision=precision)))
        else:
            from ortserve.models import resolve_model

            makers[f"ortserve {precision}"] = (OrtserveGraph, Path(resolve_model(args.model, precision=precision)))
        reference = None
        if not args.no_genai:
            path = genai_dir(args.model, precision, args.genai, not args.no_build)
            if path is not None:
                reference = f"genai {precision}"
                makers[reference] = (GenaiGraph, path)
            else:
                print(f"(no onnxruntime-genai {precision} model found; timing ortserve alone)", file=sys.stderr)

        if len(args.threads) > 1:
            makers = {f"{label} t{t}": (cls, path, t) for label, (cls, path) in makers.items() for t in args.threads}
            reference = reference and f"{reference} t"  # compared at the same thread count
        else:
            makers = {label: (cls, path, args.threads[0]) for label, (cls, path) in makers.items()}

        shared = len(makers) * args.sessions > 1  # sessions interleaved in one process

        def make(label, prefix=None, makers=makers, batch=1, shared=shared):
            cls, path, threads = makers[label]
            count, spin = int(threads.removesuffix("ns")), not (args.no_spin or threads.endswith("ns"))
            return cls(label, path, session_options(count, spin, prefix, shared), max_tokens * batch)

        # several sessions per graph: a session's own memory placement shifts its speed by a few %
        graphs = [make(label) for _ in range(args.sessions) for label in makers]
        vocab = min(g.session.get_outputs()[0].shape[-1] for g in graphs)
        context = rng.integers(0, vocab, args.context).tolist()
        prefill = rng.integers(0, vocab, args.prefill).tolist()
        results = measure(graphs, context, prefill, args.steps, args.rounds)
        for g in graphs:
            results[g.label]["path"] = str(g.path)
        del graphs
        title = args.model if not args.artifact else " vs ".join(dict.fromkeys(p.name for _, p, _ in makers.values()))
        print_results(
            f"{title} {precision}: batch-1 decode at context {args.context}, {args.prefill}-token "
            f"prefill; threads {' / '.join(map(str, args.threads))}{', no spinning' if args.no_spin else ''}; "
            f"{args.rounds} rounds of {args.steps} steps",
            results,
            reference,
        )
        entry = {"results": results, "reference": reference}
        if args.profile:
            batch = args.profile_batch
            profiles = {
                label: profile(
                    lambda prefix, label=label, batch=batch: make(label, prefix, batch=batch),
                    context,
                    prefill,
                    min(args.steps, 16),
                    batch,
                )
                for label in makers
                if batch == 1 or makers[label][0] is OrtserveGraph
            }
            if batch > 1:
                print(f"\n(decode profiles: {batch} sequences a step, each at context {args.context}; ortserve only)")
            print_profiles(profiles)
            entry["profiles"] = profiles
        report["precisions"][precision] = entry
    if not args.no_roofline:
        report["roofline"] = print_roofline(report, sorted({int(t.removesuffix("ns")) for t in args.threads}))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
