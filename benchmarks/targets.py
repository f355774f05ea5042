"""Issue #14's targets, as ratios of records (same model, same precision): ortserve against llama.cpp
on the same machine, and fp32 decode against the bandwidth roofline. A ratio whose two records come
from different compare.py runs says so."""

from __future__ import annotations

from collections.abc import Callable

from roofline import roofline_tok_s


def _get(records: list[dict], system: str, precision: str, workload: str) -> dict | None:
    return next(
        (r for r in records if (r["system"], r["precision"], r["workload"]) == (system, precision, workload)), None
    )


def targets(
    records: list[dict],
    bandwidth: float | None,
    weight_bytes: Callable[..., int | None],
    run_of: Callable[[dict], int | None] = lambda record: None,
) -> list[str]:
    """The targets table; ``run_of`` gives a record's run, so that a ratio across two runs is marked."""

    def g(*a: str) -> float | None:
        """The metric a[3] of the record (system, precision, workload) = a[:3]."""
        r = _get(records, *a[:3])
        return r["metrics"].get(a[3]) if r else None

    def ratio(name: str, a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, float | None]:
        """``name`` and g(*a) / g(*b), the name marked when the two records come from different runs."""
        ra, rb = _get(records, *a[:3]), _get(records, *b[:3])
        if ra and rb and run_of(ra) != run_of(rb):
            name += " (two runs)"
        va, vb = g(*a), g(*b)
        return name, (va / vb if va and vb else None)

    wb = weight_bytes("ortserve", "fp32", records[0]["model"]) if records else None
    bw = g("ortserve", "fp32", "decode", "bandwidth_GBps") or bandwidth
    roof = roofline_tok_s(bw, wb) if wb and bw else None
    rows: list[tuple[tuple[str, float | None], float]] = []
    for q in ("int4", "fp32"):
        # ortserve's default (16-bit activations) and, for int4, ortserve-a8: int8 activations as llama.cpp's
        for system in ("ortserve", "ortserve-a8") if q == "int4" else ("ortserve",):
            who = "" if system == "ortserve" else f" ({system}: int8 activations)"
            ours, theirs = (system, q), ("llama.cpp", q)
            rows += [
                (
                    ratio(
                        f"decode vs llama.cpp, {q}{who}",
                        (*ours, "decode", "decode_tok_s"),
                        (*theirs, "decode", "decode_tok_s"),
                    ),
                    1.1,
                ),
                (
                    ratio(
                        f"prefill (512) vs llama.cpp, {q}{who}",
                        (*ours, "prefill", "prompt_tok_s"),
                        (*theirs, "prefill", "prompt_tok_s"),
                    ),
                    1.1,
                ),
                (
                    ratio(
                        f"c16 output tok/s vs llama.cpp's server with 16 slots, {q}{who}",
                        (*ours, "serve-c16", "output_throughput"),
                        (*theirs, "serve-c16", "output_throughput"),
                    ),
                    1.5,
                ),
                (
                    ratio(
                        f"c16 TTFT p50: llama.cpp / ortserve, {q}{who} (≥ 1 = no worse)",
                        (*theirs, "serve-c16", "ttft_p50_ms"),
                        (*ours, "serve-c16", "ttft_p50_ms"),
                    ),
                    1.0,
                ),
            ]
        rows.append(
            (
                ratio(
                    f"grounded text, n-gram speculation vs llama.cpp's n-gram mode, {q}",
                    ("ortserve-ngram", q, "grounded", "output_throughput"),
                    ("llama.cpp-ngram", q, "grounded", "output_throughput"),
                ),
                1.5,
            )
        )
    decode = g("ortserve", "fp32", "decode", "decode_tok_s")
    rows.append((("fp32 decode / roofline", decode / roof if decode and roof else None), 0.85))
    out = ["| target | ratio | goal | met |", "|---|---:|---:|---|"]
    for (name, value), goal in rows:
        met = "–" if value is None else ("yes" if value >= goal else "**no**")
        if name.endswith("roofline") and value is not None and value > 1.0:  # faster than the memory: impossible
            met = "unclear: above 1, the bandwidth moved between the run and its measurements"
        out.append(f"| {name} | {'–' if value is None else shown(value, goal)} | ≥ {goal} | {met} |")
    return out


def shown(ratio: float, goal: float) -> str:
    """Two decimals, or three where two would round a miss up to the goal (0.846 of 0.85 reads 0.846)."""
    return f"{ratio:,.3f}" if ratio < goal <= round(ratio, 2) else f"{ratio:,.2f}"
