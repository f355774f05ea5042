"""``optimum-cli export ortserve`` (the plugin the wheel installs) runs ``ortserve export``."""

from __future__ import annotations

import shutil
import subprocess

from ortserve.artifact import load_manifest


def test_optimum_cli_export_ortserve_writes_an_artifact(tiny_checkpoint, tmp_path):
    optimum_cli = shutil.which("optimum-cli")
    assert optimum_cli, "optimum-cli is not on PATH: install the test extra (pip install '.[test]')"
    out = tmp_path / "artifact"
    done = subprocess.run(
        [
            optimum_cli,
            "export",
            "ortserve",
            str(tiny_checkpoint("llama2")),
            "-o",
            str(out),
            "--precision",
            "int8",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert load_manifest(out).weight_precision == "int8"
