"""What exporting SmolLM2 costs (a benchmark figure, not a timed assertion), measured in a child
process with torch unimportable, as on a serving machine. Issue 3's target for int4: < 2 minutes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_torch_free import run_without_torch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_export_time_and_peak_rss(precision: str, smollm2_checkpoint: Path, tmp_path: Path, report_figure):
    result = run_without_torch(
        f"""
        import json, time
        started = time.perf_counter()
        from ortserve.export import export_model
        manifest = export_model({str(smollm2_checkpoint)!r}, {str(tmp_path / "artifact")!r},
                                precision={precision!r}, progress=False)
        print(json.dumps({{"seconds": time.perf_counter() - started, "weight_bytes": manifest.weight_bytes,
                          "peak_rss": peak_rss()}}))
        """,
        tmp_path / "cache",
    )
    cost = json.loads(result.stdout.strip().splitlines()[-1])
    report_figure(
        f"SmolLM2 {precision} export: {cost['seconds']:.1f} s, peak RSS {cost['peak_rss'] / 2**20:.0f} MiB, "
        f"weights {cost['weight_bytes'] / 2**20:.0f} MiB (target for int4: < 120 s)"
    )
