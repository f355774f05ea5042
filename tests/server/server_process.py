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
CHECKOUT = HERE.parent.parent  # servers import the code under test, as the test process does
LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


def poll(predicate, timeout: float, interval: float = 0.05):
    """predicate()'s first truthy value within `timeout` s, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(interval)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    """predicate()'s first truthy value within `timeout` s; fails the test if there is none."""
    value = poll(predicate, timeout, interval)
    if value is None:
        raise AssertionError(f"condition not met within {timeout}s")
    return value


class ServerProcess:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.api_key = argv[argv.index("--api-key") + 1] if "--api-key" in argv else None
        self.lines: list[str] = []
        self.base_url: str | None = None
        self._url_seen = threading.Event()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=HERE,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]),
                **(env or {}),
            },
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def real(cls, artifact: Path | str, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
        return cls([sys.executable, "-m", "ortserve.cli", "serve", str(artifact), "--port", "0", *flags], env)

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

    def wait_output(self, text: str, timeout: float = 10) -> bool:
        """Whether `text` shows in the output within `timeout` s: a line logged as a response goes out
        can reach the reader thread after the client has the response."""
        return poll(lambda: text in self.output, timeout) is not None

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

    def metrics(self, api_key: str | None = None) -> dict[str, float]:
        """/metrics read with prometheus_client's parser: sample name -> value, the labels other
        than model_name (finished_reason, event) kept as ``name{value}``."""
        from prometheus_client.parser import text_string_to_metric_families

        key = api_key or self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        text = httpx.get(f"{self.base_url}/metrics", timeout=10, headers=headers).text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = [v for k, v in sample.labels.items() if k in ("finished_reason", "event")]
                name = sample.name + "".join(f"{{{v}}}" for v in labels)
                values[name] = values.get(name, 0.0) + sample.value
        return values
