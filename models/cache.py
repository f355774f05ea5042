"""The user cache directory, and the two moves that keep it sound: a lock per entry, and
publishing a finished directory with one rename (a crash never leaves a half entry that loads)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$ORTSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortserve``, else ``~/.cache/ortserve``."""
    explicit = os.environ.get("ORTSERVE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ortserve"


@contextlib.contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``entry`` (a sibling ``.lock`` file), so two processes that
    want the same entry build it once: the second waits, then finds it done."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def staging_dir(entry: Path) -> Iterator[Path]:
    """A scratch directory beside ``entry``; on success it replaces ``entry`` in one rename,
    on failure it is deleted. Call under ``locked(entry)``."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the published entry is an ordinary folder
    try:
        yield scratch
        remove(entry)
        os.rename(scratch, entry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def remove(entry: Path) -> None:
    """Delete a cache entry: first rename it aside, so no reader sees it half deleted."""
    if not entry.exists():
        return
    doomed = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".old", dir=entry.parent))
    os.rename(entry, doomed / entry.name)
    shutil.rmtree(doomed, ignore_errors=True)
