"""Reading a server's Prometheus counters."""

from __future__ import annotations

from ortserve.bench.server_metrics import delta, parse_counters

TEXT = """\
# HELP ortserve:prompt_tokens_total Prompt tokens processed.
# TYPE ortserve:prompt_tokens_total counter
ortserve:prompt_tokens_total 1280.0
ortserve:generation_tokens_total{model_name="smol"} 640.0
ortserve:request_success_total{finished_reason="length",model_name="smol"} 4.0
ortserve:request_success_total{finished_reason="stop",model_name="smol"} 1.0
ortserve:num_requests_running 2.0
ortserve:e2e_request_latency_seconds_count 5.0
"""


def test_counters_are_summed_over_label_sets():
    c = parse_counters(TEXT)
    assert c == {
        "ortserve:prompt_tokens_total": 1280.0,
        "ortserve:generation_tokens_total": 640.0,
        "ortserve:request_success_total": 5.0,
    }


def test_delta_keeps_only_what_changed():
    before = {"a_total": 1.0, "b_total": 2.0}
    after = {"a_total": 4.0, "b_total": 2.0, "c_total": 1.0}
    assert delta(before, after) == {"a_total": 3.0, "c_total": 1.0}
    assert delta(None, after) == {}
