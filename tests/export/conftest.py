"""Fixtures of the export tests: tiny checkpoints (see ``export_cases``) and their artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest
from export_cases import LARGEST_DIFFS, build_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``tiny_checkpoint(case)`` -> checkpoint directory, built once per session."""
    built: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in built:
            built[case] = build_checkpoint(case, tmp_path_factory.mktemp(case))
        return built[case]

    return get


@pytest.fixture(scope="session")
def tiny_artifact(tiny_checkpoint, tmp_path_factory):
    """``tiny_artifact(case, precision="fp32")`` -> exported artifact directory, built once."""
    from ortserve.export import export_model

    built: dict[tuple[str, str], Path] = {}

    def get(case: str, precision: str = "fp32") -> Path:
        if (case, precision) not in built:
            out = tmp_path_factory.mktemp(f"{case}-{precision}") / "artifact"
            export_model(tiny_checkpoint(case), out, precision=precision, progress=False)
            built[case, precision] = out
        return built[case, precision]

    return get


def pytest_terminal_summary(terminalreporter):
    diffs = LARGEST_DIFFS
    if diffs:
        terminalreporter.section("export: largest |logit diff| vs transformers (fp32)")
        for case, diff in sorted(diffs.items()):
            terminalreporter.write_line(f"{case:32s} {diff:.2e}")
