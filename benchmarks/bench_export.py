"""What exporting SmolLM2 costs, per precision: wall time and peak RSS of the export, run in a
child process with torch unimportable (as on a serving machine). Issue 3's target for int4 was
under 2 minutes. A benchmark figure, so it lives here and not in the tests.

    python benchmarks/bench_export.py [--precisions fp32 int8 int4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.modules["torch"] = None  # serving machines have no torch
    from ortserve.export import export_model
    from ortserve.models import prepare_checkpoint
    checkpoint = prepare_checkpoint("smollm2-135m-instruct", progress=False)
    started = time.perf_counter()
    manifest = export_model(checkpoint, sys.argv[2], precision=sys.argv[1], progress=False)
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as status:  # VmHWM: this process's own peak
        peak = int(next(line.split()[1] for line in status if line.startswith("VmHWM:"))) * 1024
    print(json.dumps({"seconds": seconds, "peak_rss": peak, "weight_bytes": manifest.weight_bytes}))
    """
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8", "int4"])
    args = parser.parse_args()
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", file=sys.stderr)
    for precision in args.precisions:
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [sys.executable, "-c", CHILD, precision, f"{out}/artifact"],
                capture_output=True,
                text=True,
                check=True,
                timeout=1800,
            )
        cost = json.loads(result.stdout.strip().splitlines()[-1])
        print(
            f"SmolLM2 {precision} export: {cost['seconds']:.1f} s, peak RSS {cost['peak_rss'] / 2**20:.0f} MiB, "
            f"weights {cost['weight_bytes'] / 2**20:.0f} MiB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
