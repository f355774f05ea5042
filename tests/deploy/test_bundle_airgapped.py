"""The air-gapped install: build a bundle of the tiny Llama artifact, then, in a network namespace
with no route out, a fresh venv, PIP_NO_INDEX and no compiler on PATH, run its install.sh, serve
the artifact, and answer one chat request. Sizes are printed and bounded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from ortserve.deploy.bundle import glibc_floor

pytestmark = pytest.mark.deploy
TOOLS = ("sh", "python3", "sha256sum", "dirname", "sleep", "cat", "kill", "ip")


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


@pytest.fixture(scope="module")
def bundle(tiny_llama_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    result = subprocess.run(
        [sys.executable, "-m", "ortserve.cli", "bundle", str(tiny_llama_artifact), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_the_bundle_holds_binary_wheels_without_torch(bundle: Path):
    wheels = [p.name for p in (bundle / "wheelhouse").iterdir()]
    ours = [w for w in wheels if w.startswith("ortserve-")]
    assert len(ours) == 1 and "-manylinux_" in ours[0]  # auditwheel's tag: the op library is in it
    assert not [w for w in wheels if w.lower().startswith(("torch", "nvidia"))]
    assert all(w.endswith(".whl") for w in wheels)  # nothing to build on the target
    size = size_mib(bundle)
    print(f"bundle size {size:.0f} MiB, {len(wheels)} wheels")
    assert size < 600


def test_the_op_library_needs_only_the_c_library(bundle: Path, tmp_path: Path):
    """ldd of the library inside the wheel: libc, libm and the loader, nothing else (its C++
    runtime is linked in), and every one found."""
    wheel = next((bundle / "wheelhouse").glob("ortserve-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        library = Path(archive.extract("ortserve/ops/libortserve_ops.so", tmp_path))
    ldd = subprocess.run(["ldd", str(library)], capture_output=True, text=True, check=True).stdout
    needed = {line.split()[0] for line in ldd.splitlines() if line.strip()}
    assert "not found" not in ldd
    assert needed <= {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "/lib64/ld-linux-x86-64.so.2"}, ldd


def test_the_readme_states_the_targets_cpu_python_and_glibc(bundle: Path):
    readme = (bundle / "README.txt").read_text()
    floor = glibc_floor([p.name for p in (bundle / "wheelhouse").iterdir()])
    assert floor is not None
    (major, minor), _ = floor
    assert f"glibc {major}.{minor} or newer" in readme
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in readme
    assert "x86-64-v3 (AVX2 + FMA" in readme


def test_install_and_serve_with_no_network_and_no_compiler(bundle: Path, tmp_path: Path):
    unshare = shutil.which("unshare")  # looked up here: the PATH given to it below holds only TOOLS
    assert unshare, "unshare (util-linux) is not installed"
    if subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode != 0:
        pytest.fail("unshare -n is not permitted here: run as root (CI does)")
    tools = tmp_path / "bin"  # PATH holds these and nothing else: no gcc, g++, cc, cmake
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    venv = tmp_path / "venv"
    script = textwrap.dedent(f"""
        set -eu
        ip link set lo up
        sh {bundle}/install.sh {venv}
        {venv}/bin/ortserve serve {bundle}/artifact --port 8931 --served-model-name tiny --threads-bind nobind \\
            --kv-cache-space 0.05 > {tmp_path}/serve.log 2>&1 &
        SERVER=$!
        {venv}/bin/python - <<'PY'
        import time, httpx
        for _ in range(240):
            try:
                if httpx.get("http://127.0.0.1:8931/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        reply = httpx.post("http://127.0.0.1:8931/v1/chat/completions", timeout=120, json={{
            "model": "tiny", "temperature": 0, "max_tokens": 8,
            "messages": [{{"role": "user", "content": "Hello there"}}]}})
        print("STATUS", reply.status_code, reply.json()["choices"][0]["finish_reason"])
        PY
        kill $SERVER
        """)
    env = {
        "PATH": str(tools),
        "HOME": str(tmp_path),
        "PIP_NO_INDEX": "1",
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "no_proxy": "127.0.0.1,localhost",  # the proxies block the way out, not the local server
        "PIP_CONFIG_FILE": os.devnull,
    }
    assert shutil.which("gcc", path=env["PATH"]) is None and shutil.which("cc", path=env["PATH"]) is None
    result = subprocess.run(
        [unshare, "-n", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert result.returncode == 0 and "STATUS 200" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:] + log
    installed = size_mib(venv)
    site = next(venv.glob("lib/python*/site-packages"))
    print(f"installed size {installed:.0f} MiB")
    assert not (site / "torch").exists()
    assert installed < 1500
