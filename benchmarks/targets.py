"""Issue #14's targets, as ratios from the records of one run (same model, same precision): ortserve
against llama.cpp on the same machine, and fp32 decode against the bandwidth roofline."""

from __future__ import annotations

from collections.abc import Callable

from roofline import roofline_tok_s


def _get(records: list[dict], system: str, precision: str, workload: str, key: str) -> float | None:
    r = next(
        (r for r in records if (r["system"], r["precision"], r["workload"]) == (system, precision, workload)), None
    )
    return r["metrics"].get(key) if r else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def targets(records: list[dict], bandwidth: float | None, weight_bytes: Callable[..., int | None]) -> list[str]:
    def g(*a: str) -> float | None:
        return _get(records, *a)

    wb = weight_bytes("ortserve", "fp32", records[0]["model"]) if records else None
    bw = g("ortserve", "fp32", "decode", "bandwidth_GBps") or bandwidth
    roof = roofline_tok_s(bw, wb) if wb and bw else None
    rows: list[tuple[str, float | None, float]] = []
    for q in ("int4", "fp32"):
        # ortserve's default (16-bit activations) and, for int4, ortserve-a8: int8 activations as llama.cpp's
        for system in ("ortserve", "ortserve-a8") if q == "int4" else ("ortserve",):
            who = "" if system == "ortserve" else f" ({system}: int8 activations)"
            rows += [
                (
                    f"decode vs llama.cpp, {q}{who}",
                    _ratio(g(system, q, "decode", "decode_tok_s"), g("llama.cpp", q, "decode", "decode_tok_s")),
                    1.1,
                ),
                (
                    f"prefill (512) vs llama.cpp, {q}{who}",
                    _ratio(g(system, q, "prefill", "prompt_tok_s"), g("llama.cpp", q, "prefill", "prompt_tok_s")),
                    1.1,
                ),
                (
                    f"c16 output tok/s vs llama.cpp's server with 16 slots, {q}{who}",
                    _ratio(
                        g(system, q, "serve-c16", "output_throughput"),
                        g("llama.cpp", q, "serve-c16", "output_throughput"),
                    ),
                    1.5,
                ),
                (
                    f"c16 TTFT p50: llama.cpp / ortserve, {q}{who} (≥ 1 = no worse)",
                    _ratio(g("llama.cpp", q, "serve-c16", "ttft_p50_ms"), g(system, q, "serve-c16", "ttft_p50_ms")),
                    1.0,
                ),
            ]
        rows.append(
            (
                f"grounded text, n-gram speculation vs llama.cpp's n-gram mode, {q}",
                _ratio(
                    g("ortserve-ngram", q, "grounded", "output_throughput"),
                    g("llama.cpp-ngram", q, "grounded", "output_throughput"),
                ),
                1.5,
            )
        )
    rows.append(("fp32 decode / roofline", _ratio(g("ortserve", "fp32", "decode", "decode_tok_s"), roof), 0.85))
    out = ["| target | ratio | goal | met |", "|---|---:|---:|---|"]
    for name, ratio, goal in rows:
        met = "–" if ratio is None else ("yes" if ratio >= goal else "**no**")
        out.append(f"| {name} | {'–' if ratio is None else f'{ratio:,.2f}'} | ≥ {goal} | {met} |")
    return out
