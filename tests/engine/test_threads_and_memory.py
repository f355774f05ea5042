"""--threads-bind / --reserved-cpus parsing, and the KV memory plan with its start-up error."""

from __future__ import annotations

import argparse
import os

import pytest

import ortserve.engine.threads as threads_module
from ortserve.artifact import ArtifactManifest
from ortserve.engine.config import EngineConfig, add_engine_arguments
from ortserve.engine.core import EngineCore, pool_shares_cores
from ortserve.engine.memory import GIB, MemoryCheckError, plan_kv_cache
from ortserve.engine.threads import ThreadsBindError, format_cpu_list, parse_cpu_list, plan_threads


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-3,6, 8-9") == [0, 1, 2, 3, 6, 8, 9]
    assert format_cpu_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    for bad in ("", "a", "3-1", "1-x"):
        with pytest.raises(ThreadsBindError, match="--threads-bind"):
            parse_cpu_list(bad)


@pytest.fixture
def eight_cpus_four_cores(monkeypatch):
    """A faked machine, whatever this one has: CPUs 0-7, where 4-7 are SMT siblings of 0-3."""
    monkeypatch.setattr(threads_module.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threads_module, "physical_cores", lambda allowed: [c for c in allowed if c < 4])


def test_auto_uses_physical_cores_and_reserves_from_the_end(eight_cpus_four_cores):
    plan = plan_threads("auto")
    assert plan.bind and plan.cores == (0, 1, 2, 3)
    assert plan_threads("auto", reserved_cpus=1).cores == (0, 1, 2)
    with pytest.raises(ThreadsBindError, match="--reserved-cpus 4 leaves no core"):
        plan_threads("auto", reserved_cpus=4)


def test_explicit_list_and_affinity_string(eight_cpus_four_cores):
    assert plan_threads("5").cores == (5,) and plan_threads("5").ort_affinities() == ""
    two = plan_threads("0-1")
    assert two.cores == (0, 1) and two.ort_affinities() == "2"  # ORT counts from 1; thread 0 is the caller
    assert plan_threads("0,2-3").ort_affinities() == "3;4"
    with pytest.raises(ThreadsBindError, match="may not use"):
        plan_threads("4000")


def test_threads_takes_the_first_cores_auto_or_nobind_would(eight_cpus_four_cores):
    assert plan_threads("auto", threads=2).cores == (0, 1)
    assert plan_threads("auto", reserved_cpus=1, threads=3).cores == (0, 1, 2)
    assert plan_threads("nobind", threads=6).num_threads == 6 and not plan_threads("nobind", threads=6).bind
    with pytest.raises(ThreadsBindError, match=r"--threads 5: the engine has 4 cores .* use at most 4"):
        plan_threads("auto", threads=5)
    with pytest.raises(ThreadsBindError, match="give one"):
        plan_threads("0-1", threads=2)


def test_nobind_pins_nothing(eight_cpus_four_cores):
    plan = plan_threads("nobind")
    assert not plan.bind and plan.num_threads == 8
    assert plan_threads("nobind", reserved_cpus=2).num_threads == 6


MANIFEST = ArtifactManifest(
    architecture="llama",
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_size=64,
    vocab_size=49152,
    max_model_len=8192,
    weight_precision="fp32",
    lm_head_precision="fp32",
    num_parameters=134_515_008,
    weight_bytes=538_060_032,
    source="test",
    source_fingerprint="x",
)


def test_kv_budget_buys_whole_blocks():
    plan = plan_kv_cache(MANIFEST, 16, kv_cache_space=1.0, default_space=4.0, available=16 * GIB)
    assert plan.bytes_per_block == 2 * 30 * 3 * 64 * 4 * 16
    assert plan.num_blocks == GIB // plan.bytes_per_block
    assert plan.total_bytes <= GIB


def test_kv_budget_larger_than_memory_names_the_flag_and_a_value_that_fits():
    with pytest.raises(MemoryCheckError) as info:
        plan_kv_cache(MANIFEST, 16, kv_cache_space=64.0, default_space=4.0, available=8 * GIB)
    message = str(info.value)
    assert "--kv-cache-space 64" in message and "use --kv-cache-space" in message
    fits = float(message.split("use --kv-cache-space ")[1].split()[0])
    plan_kv_cache(MANIFEST, 16, kv_cache_space=fits, default_space=4.0, available=8 * GIB)  # no error


def test_unset_budget_shrinks_to_what_fits():
    plan = plan_kv_cache(MANIFEST, 16, kv_cache_space=None, default_space=4.0, available=3 * GIB)
    assert 0 < plan.budget_bytes < 2 * GIB


def test_engine_flags_fill_the_config_and_env_is_the_fallback(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")  # --chat-template must exist
    monkeypatch.setenv("ORTSERVE_KVCACHE_SPACE", "2.5")
    monkeypatch.setenv("ORTSERVE_THREADS_BIND", "nobind")
    parser = add_engine_arguments(argparse.ArgumentParser())
    config = EngineConfig.from_args(parser.parse_args([]))
    assert (config.kv_cache_space, config.threads_bind, config.enable_prefix_caching) == (2.5, "nobind", True)
    config = EngineConfig.from_args(
        parser.parse_args(
            [
                "--kv-cache-space",
                "1",
                "--threads-bind",
                "0",
                "--max-num-seqs",
                "4",
                "--block-size",
                "32",
                "--max-num-batched-tokens",
                "64",
                "--max-model-len",
                "512",
                "--reserved-cpus",
                "1",
                "--no-prefix-caching",
                "--precision",
                "int4",
                "--activation-bits",
                "8",
                "--chat-template",
                "t.jinja",
                "--kv-cache-dtype",
                "int8",
                "--speculative",
                "ngram",
                "--num-speculative-tokens",
                "3",
                "--ngram-min",
                "2",
                "--ngram-max",
                "5",
                "--stream-interval",
                "8",
            ]
        )
    )
    assert config.model_dump() == {
        "model": None,
        "precision": "int4",
        "activation_bits": 8,
        "chat_template": "t.jinja",
        "block_size": 32,
        "kv_cache_space": 1.0,
        "kv_cache_dtype": "int8",
        "max_num_seqs": 4,
        "speculative": "ngram",
        "draft_model": None,
        "draft_precision": None,
        "num_speculative_tokens": 3,
        "speculative_disable_by_batch_size": None,
        "ngram_min": 2,
        "ngram_max": 5,
        "max_num_batched_tokens": 64,
        "max_model_len": 512,
        "threads_bind": "0",
        "reserved_cpus": 1,
        "threads": None,
        "generation_config": "auto",
        "stream_interval": 8,
        "enable_prefix_caching": False,
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stream-interval", "0"], "--stream-interval 0: input should be greater than or equal to 1"),
        (["--block-size", "300"], "--block-size 300: input should be less than or equal to 256"),
        (["--speculative", "draft"], "--speculative draft needs --draft-model MODEL"),
    ],
)
def test_a_bad_flag_is_named_with_its_value(flags, message):
    parser = add_engine_arguments(argparse.ArgumentParser())
    with pytest.raises(ValueError) as exc:
        EngineConfig.from_args(parser.parse_args(flags))
    assert str(exc.value).startswith(message)


def test_no_room_even_for_the_weights_says_so():
    with pytest.raises(MemoryCheckError, match="only 0.50 GiB is available"):
        plan_kv_cache(MANIFEST, 16, kv_cache_space=None, default_space=4.0, available=GIB // 2)


def test_the_pool_stops_spinning_where_other_work_shares_its_cores(eight_cpus_four_cores):
    physical, every_cpu, nobind = plan_threads("auto"), plan_threads("0-7"), plan_threads("nobind")
    served = EngineConfig()
    assert not pool_shares_cores(served, physical, served=True)  # the HTTP process gets the SMT siblings 4-7
    assert pool_shares_cores(served, every_cpu, served=True)  # the HTTP process streams on the engine's cores
    assert not pool_shares_cores(served, every_cpu, served=False)  # offline: nothing else runs there
    assert not pool_shares_cores(served, nobind, served=True)  # an unpinned pool never spins at all
    draft = EngineConfig(draft_model="any-draft")  # implies --speculative draft
    assert pool_shares_cores(draft, physical, served=False)  # the draft's session takes turns with it


def test_a_served_engine_on_every_core_stops_its_pool_at_each_run_end(tiny_llama_artifact):
    allowed = os.sched_getaffinity(0)
    config = EngineConfig(
        model=str(tiny_llama_artifact), kv_cache_space=0.01, threads_bind=format_cpu_list(sorted(allowed))
    )

    def options(served: bool):
        try:
            return EngineCore(config, served=served).runner.session.get_session_options()
        finally:
            os.sched_setaffinity(0, allowed)  # the engine pins its calling thread: this test's

    key = "session.force_spinning_stop"
    served = options(served=True)
    assert served.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert served.get_session_config_entry(key) == "1"
    with pytest.raises(Exception, match=f"does not have configuration with key: {key}"):  # ORT's own Fail type
        options(served=False).get_session_config_entry(key)
