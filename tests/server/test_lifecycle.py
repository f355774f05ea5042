"""Start-up, backpressure, disconnects and shutdown, against the server around the FakeCore
(one token per step, a fixed step time), so each behaviour is timed without a model."""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import openai
import pytest
from conftest import API_KEY, MAX_BODY
from server_process import wait_for


def client(proc, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proc.base_url}/v1", api_key=API_KEY, max_retries=0, **kw)


def test_health_is_503_while_the_model_loads_then_200(start_fake):
    proc = start_fake("--load-seconds", "3", ready=False)
    loading = httpx.get(f"{proc.base_url}/health")
    assert loading.status_code == 503
    assert "loading" in loading.json()["error"]["message"]
    proc.wait_ready(30)
    assert httpx.get(f"{proc.base_url}/health").status_code == 200


def test_start_up_failure_is_printed_and_exits_non_zero(start_fake):
    message = "--kv-cache-space 100 GiB does not fit in 23.1 GiB available; use --kv-cache-space 18"
    proc = start_fake("--fail", message, ready=False)
    code = proc.proc.wait(30)
    assert code != 0
    assert message in proc.output


def test_an_engine_crash_ends_in_flight_requests_with_an_error_and_the_engine_is_restarted(start_fake):
    proc = start_fake("--fail-after-steps", "5")
    with pytest.raises(openai.APIError) as err:
        for _ in client(proc).completions.create(model="fake", prompt="a b c", max_tokens=50, stream=True):
            pass
    assert "engine process failed" in str(err.value)
    assert "fake engine failure" not in str(err.value)  # the details stay in the server's log
    assert "fake engine failure for the test" in proc.output
    wait_for(lambda: httpx.get(f"{proc.base_url}/health").status_code == 200, timeout=30)
    done = client(proc).completions.create(model="fake", prompt="a b", max_tokens=2)  # within 5 steps
    assert done.choices[0].finish_reason == "length"
    assert proc.metrics()["ortserve:engine_events_total{death}"] >= 1
    assert proc.proc.poll() is None


def test_an_engine_that_keeps_dying_stops_the_server_with_a_clear_line(start_fake):
    proc = start_fake("--fail-after-steps", "0", "--max-engine-restarts", "2")
    deadline = time.monotonic() + 180  # a restart spawns a new Python process: seconds each
    while proc.proc.poll() is None and time.monotonic() < deadline:  # each request kills the engine
        try:
            client(proc, timeout=10).completions.create(model="fake", prompt="a b", max_tokens=2)
        except (openai.APIError, httpx.HTTPError):
            time.sleep(0.5)
    assert proc.proc.wait(30) == 1
    assert "giving up" in proc.output and "--max-engine-restarts" in proc.output


def test_a_request_that_fails_in_the_engine_fails_alone(start_fake):
    from fake_engine import FAULT_TOKEN

    proc = start_fake()
    api = client(proc)
    healthy = api.completions.create(model="fake", prompt="a b c", max_tokens=40, stream=True)
    chunks = iter(healthy)
    next(chunks)
    with pytest.raises(openai.InternalServerError) as err:
        api.completions.create(model="fake", prompt=[FAULT_TOKEN, 5, 6], max_tokens=5)
    assert "internal error" in err.value.body["message"] and "Traceback" not in str(err.value.body)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"  # the other stream went on


def test_a_kv_cache_that_does_not_fit_stops_the_real_server_with_the_flag_named(smollm2_artifact):
    from server_process import ServerProcess

    proc = ServerProcess.real(smollm2_artifact, "--kv-cache-space", "100000")
    code = proc.proc.wait(120)
    assert code == 1
    assert "error:" in proc.output and "--kv-cache-space" in proc.output.split("error:", 1)[1]


def test_sigterm_drains_the_real_server_and_exits_0(smollm2_artifact):
    from server_process import ServerProcess

    proc = ServerProcess.real(smollm2_artifact, "--served-model-name", "m")
    try:
        proc.wait_ready()
        api = openai.OpenAI(base_url=f"{proc.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        stream = api.completions.create(
            model="m",
            prompt="Once upon a time",
            max_tokens=20,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)
        proc.proc.send_signal(signal.SIGTERM)
        assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
        assert proc.proc.wait(60) == 0
    finally:
        if proc.proc.poll() is None:
            proc.stop()


def test_full_waiting_queue_answers_429_in_openai_shape(start_fake):
    proc = start_fake("--max-num-seqs", "1", "--max-waiting-requests", "1", "--step-seconds", "0.05")
    api = client(proc)
    streams = [
        api.completions.create(model="fake", prompt="hello there", max_tokens=200, stream=True) for _ in range(2)
    ]  # one running, one waiting
    for stream in streams:
        next(iter(stream)) if stream is streams[0] else None
    with pytest.raises(openai.RateLimitError) as err:
        api.completions.create(model="fake", prompt="one too many", max_tokens=5)
    assert err.value.status_code == 429 and err.value.response.headers["retry-after"] == "1"
    error = err.value.body
    assert "--max-waiting-requests" in error["message"] and error["code"] == "server_overloaded"
    for stream in streams:
        stream.close()


def test_a_request_larger_than_the_server_ever_holds_is_a_400_not_a_429(start_fake):
    """Running plus waiting is the most sequences a server holds: a request of more can never be
    admitted, so 'retry later' would have its client retry for ever. Idle server, nothing leaked."""
    proc = start_fake("--max-num-seqs", "2", "--max-waiting-requests", "3")
    api = client(proc)
    for create, asked in (
        (lambda: api.completions.create(model="fake", prompt=["a", "b", "c"], n=2, max_tokens=2), "3 prompts x n 2"),
        (lambda: api.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}], n=6), "n 6"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            create()
        message = err.value.body["message"]
        assert f"asks for 6 sequences ({asked})" in message and "--max-waiting-requests" in message, message
        assert err.value.body["param"] == "n"
    fits = api.completions.create(model="fake", prompt=["a", "b"], n=2, max_tokens=2)  # 4 of 5: admitted
    assert len(fits.choices) == 4
    assert proc.metrics()["ortserve:num_requests_running"] == 0


def test_stream_disconnect_aborts_the_request_within_a_step(fake_server):
    before = fake_server.metrics()
    stream = client(fake_server).completions.create(model="fake", prompt="a b c d", max_tokens=240, stream=True)
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    # The abort is counted by the HTTP process at once; the running gauge follows with the engine's
    # next stats message, so wait for both.
    after = wait_for(
        lambda: (
            (m := fake_server.metrics())["ortserve:request_success_total{abort}"]
            > before["ortserve:request_success_total{abort}"]
            and m["ortserve:num_requests_running"] == 0
            and m
        )
    )
    assert after["ortserve:num_requests_running"] == 0
    generated = after["ortserve:generation_tokens_total"] - before["ortserve:generation_tokens_total"]
    assert generated < 100  # aborted long before its 240 tokens (one per 20 ms step)


def test_non_streaming_disconnect_aborts_the_request(fake_server):
    before = fake_server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{fake_server.base_url}/v1/completions",
            timeout=0.5,
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"prompt": "a b c d", "max_tokens": 240},
        )
    # The abort is counted by the HTTP process at once; the running gauge follows with the engine's
    # next stats message, so wait for both.
    after = wait_for(
        lambda: (
            (m := fake_server.metrics())["ortserve:request_success_total{abort}"]
            > before["ortserve:request_success_total{abort}"]
            and m["ortserve:num_requests_running"] == 0
            and m
        )
    )
    assert after["ortserve:num_requests_running"] == 0


def test_a_client_that_leaves_mid_body_is_no_internal_error(start_fake):
    """Litestar raises a 500-class exception when the body stops short; that is the client's doing."""
    fake_server = start_fake("--log-level", "info", "--api-key", API_KEY)
    host, port = fake_server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"prompt": "a b'
        )
        time.sleep(0.3)
    wait_for(lambda: "disconnected before its request body arrived" in fake_server.output, timeout=10)
    assert "internal error" not in fake_server.output
    assert httpx.get(f"{fake_server.base_url}/health").status_code == 200


def test_body_above_the_limit_is_413(fake_server):
    response = httpx.post(
        f"{fake_server.base_url}/v1/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"prompt": "x" * (MAX_BODY + 10)},
    )
    assert response.status_code == 413
    assert "--max-request-body-bytes" in response.json()["error"]["message"]


def test_an_unknown_route_or_method_is_answered_with_what_the_server_has(fake_server):
    api = openai.OpenAI(base_url=f"{fake_server.base_url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        api.embeddings.create(model="fake", input="hi")
    message = missing.value.body["message"]
    assert message.startswith("there is no POST /v1/embeddings on this server; it serves ")
    assert "POST /v1/chat/completions" in message and "GET /v1/models/{model_id}" in message
    with pytest.raises(openai.NotFoundError) as stored:
        api.responses.retrieve("resp_1")
    assert "stores no responses" in stored.value.body["message"]
    wrong = httpx.post(f"{fake_server.base_url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert wrong.status_code == 405
    assert wrong.json()["error"]["message"] == "POST /v1/models is not allowed: /v1/models takes GET"


def test_openapi_schema_documents_the_routes_behind_the_api_key(fake_server):
    assert httpx.get(f"{fake_server.base_url}/schema/openapi.json").status_code == 401
    schema = httpx.get(
        f"{fake_server.base_url}/schema/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"}
    ).json()
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    ):
        assert path in schema["paths"]
    assert "CompletionRequest" in schema["components"]["schemas"]


def test_sigterm_lets_in_flight_requests_finish_then_exits_0(start_fake):
    proc = start_fake()
    stream = client(proc).completions.create(model="fake", prompt="a b c", max_tokens=60, stream=True)
    chunks = iter(stream)
    next(chunks)
    proc.proc.send_signal(signal.SIGTERM)
    rest = list(chunks)  # ~1.2 s of steps after the signal
    assert rest[-1].choices[0].finish_reason == "length"
    assert proc.proc.wait(30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{proc.base_url}/health")


def test_sigterm_ends_what_outlasts_the_drain_timeout_with_an_error_event_and_done(start_fake):
    proc = start_fake("--drain-timeout", "1")
    threading.Timer(0.5, proc.proc.send_signal, [signal.SIGTERM]).start()
    start = time.monotonic()
    response = httpx.post(
        f"{proc.base_url}/v1/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": "fake", "prompt": "a b c", "max_tokens": 240, "stream": True},
        timeout=30,
    )
    assert response.status_code == 200
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert time.monotonic() - start < 4.0  # the request alone would take ~5 s
    assert '"error"' in events[-2] and "shutting down" in events[-2] and events[-1] == "data: [DONE]"
    assert proc.proc.wait(30) == 0


def _ignore_errors(stream):
    try:
        yield from stream
    except Exception:
        return
