"""A real server process on 127.0.0.1 for the tests: start, wait for /health, stop with SIGTERM."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent
LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


class ServerProcess:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.lines: list[str] = []
        self.base_url: str | None = None
        self._url_seen = threading.Event()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=HERE, env={**os.environ, **(env or {})},
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def real(cls, artifact: Path | str, *flags: str) -> ServerProcess:
        return cls([sys.executable, "-m", "ortserve.cli", "serve", str(artifact), "--port", "0", *flags])

    @classmethod
    def fake(cls, tokenizer_dir: Path | str, *flags: str) -> ServerProcess:
        return cls([sys.executable, str(HERE / "fake_server.py"), str(tokenizer_dir), *flags])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = LISTENING.search(line)
            if match and self.base_url is None:
                self.base_url = match.group(1)
                self._url_seen.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_listening(self, timeout: float = 60) -> str:
        if not self._url_seen.wait(timeout):
            raise RuntimeError(f"server did not start listening:\n{self.output}")
        assert self.base_url is not None
        return self.base_url

    def wait_ready(self, timeout: float = 300) -> str:
        url = self.wait_listening()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.output}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (SIGKILL after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def metrics(self) -> dict[str, float]:
        """The unlabelled-looking view of /metrics: metric name (labels dropped) -> value."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            if "finished_reason=" in name_labels:
                name += "{" + name_labels.split("finished_reason=", 1)[1].split('"')[1] + "}"
            values[name] = values.get(name, 0.0) + float(value)
        return values
