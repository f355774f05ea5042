"""Memory bandwidth of this machine, for the decode roofline.

    python benchmarks/membw.py [--gib 2] [--threads 1,2] [--json out.json]

Compiles a tiny C kernel on the fly (cc -O3 -march=native -fopenmp) and times, over arrays of
--gib GiB each (far beyond any cache; transparent huge pages requested), best of several passes:
  read   sum of one float array          bytes counted: N·4          (what decode does to weights)
  read4  the same sum as 4 streams/thread bytes counted: N·4          (more prefetch streams in flight)
  triad  a[i] = b[i] + s·c[i]            bytes counted: 3·N·4 (STREAM convention, no write-allocate)
With no C compiler it falls back to numpy (read only; threads split the array).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

C_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
static float *alloc(size_t bytes) {   /* 2 MiB aligned and huge pages asked for: prefetchers stop at 4 KiB pages */
    float *p = aligned_alloc(1 << 21, (bytes + (1 << 21) - 1) & ~(size_t)((1 << 21) - 1));
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}
int main(int argc, char **argv) {
    size_t n = (size_t)atoll(argv[1]) / sizeof(float);
    int reps = atoi(argv[2]);
    float *a = alloc(n * sizeof(float)), *b = alloc(n * sizeof(float)), *c = alloc(n * sizeof(float));
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { a[i] = 0.f; b[i] = 1.f; c[i] = 2.f; }   /* first touch per thread */
    double best_read = 1e30, best_read4 = 1e30, best_triad = 1e30, sink = 0;
    size_t q = n / 4;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        float s = 0;   /* simd: 16 lanes of partial sums, so the loop is bound by memory, not add latency */
        #pragma omp parallel for simd schedule(static) reduction(+:s)
        for (size_t i = 0; i < n; i++) s += b[i];
        double t1 = omp_get_wtime();
        float s4 = 0;  /* the same bytes as four concurrent streams per thread: more prefetches in flight */
        #pragma omp parallel for simd schedule(static) reduction(+:s4)
        for (size_t i = 0; i < q; i++) s4 += b[i] + b[i + q] + b[i + 2 * q] + b[i + 3 * q];
        double t2 = omp_get_wtime();
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.f * c[i];
        double t3 = omp_get_wtime();
        sink += s + s4 + a[r];
        if (t1 - t0 < best_read) best_read = t1 - t0;
        if (t2 - t1 < best_read4) best_read4 = t2 - t1;
        if (t3 - t2 < best_triad) best_triad = t3 - t2;
    }
    printf("{\"read_GBps\": %.3f, \"read4_GBps\": %.3f, \"triad_GBps\": %.3f, \"sink\": %g}\n",
           n * 4.0 / best_read / 1e9, 4.0 * q * 4.0 / best_read4 / 1e9, 3.0 * n * 4.0 / best_triad / 1e9, sink);
    return 0;
}
"""


def _compile() -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    tag = hashlib.sha1(C_SOURCE.encode()).hexdigest()[:10]
    exe = Path(tempfile.gettempdir()) / f"ortserve-membw-{tag}"
    if not exe.exists():
        src = exe.with_suffix(".c")
        src.write_text(C_SOURCE)
        result = subprocess.run(
            [cc, "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)], capture_output=True, text=True
        )
        if result.returncode != 0:
            print(f"membw: C build failed, using numpy:\n{result.stderr}")
            return None
    return exe


def measure_c(exe: Path, nbytes: int, threads: int, reps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}
    out = subprocess.run([str(exe), str(nbytes), str(reps)], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout)
    result.pop("sink")
    return result


def measure_numpy(nbytes: int, threads: int, reps: int) -> dict:
    import numpy as np

    data = np.ones(nbytes // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(reps):
        workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return {"read_GBps": round(nbytes / best / 1e9, 3)}


def measure(gib: float = 2.0, threads: list[int] = (1, 2), reps: int = 5) -> dict:
    """{"method": "c"|"numpy", "array_GiB": gib, "threads": {"1": {"read_GBps": ..}, ...}}."""
    nbytes = int(gib * (1 << 30))
    exe = _compile()
    results = {}
    for t in threads:
        results[str(t)] = measure_c(exe, nbytes, t, reps) if exe else measure_numpy(nbytes, t, reps)
    return {"method": "c" if exe else "numpy", "array_GiB": gib, "threads": results}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=2.0, help="size of each array (default 2 GiB; 3 arrays for triad)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = measure(args.gib, [int(t) for t in args.threads.split(",")], args.reps)
    for t, r in result["threads"].items():
        print(f"{t} thread(s): " + ", ".join(f"{k.replace('_GBps', '')} {v:.1f} GB/s" for k, v in r.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
