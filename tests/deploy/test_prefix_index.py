"""The prefix-affinity router's index: prompts cut into chunks chained by hash, each chunk key
mapped to the replicas that were sent it; the routing key taken from a request body."""

from __future__ import annotations

import pytest

from ortserve.deploy.prefix_index import PrefixIndex, routing_key

SYSTEM = "You are a careful assistant. " * 10  # 290 characters: 4 full chunks of 64


def test_a_prompt_sharing_a_prefix_matches_the_replica_that_was_sent_it():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=64)
    index.insert(SYSTEM + "What is 2 + 2?", "a")
    index.insert("Something else entirely. " * 10, "b")
    match = index.match(SYSTEM + "Name a colour.", ["a", "b"])
    assert match.replicas == {"a"}
    assert match.matched_chars == 256  # the 4 full chunks of the shared system prompt
    assert 0.8 < match.rate < 0.9


def test_the_longest_match_wins_among_holders():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=8)
    index.insert("aaaaaaaabbbbbbbb", "short")  # 2 chunks
    index.insert("aaaaaaaabbbbbbbbcccccccc", "long")  # the same 2, then a third
    assert index.match("aaaaaaaabbbbbbbbcccccccczz", ["short", "long"]).replicas == {"long"}
    assert index.match("aaaaaaaabbbbbbbbdddddddd", ["short", "long"]).replicas == {"short", "long"}
    assert index.match("aaaaaaaaxxxxxxxx", ["short", "long"]).matched_chars == 8


def test_a_chunk_counts_only_after_the_same_earlier_chunks():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=4)
    index.insert("xxxxSAME", "a")
    assert index.match("yyyySAME", ["a"]).replicas == frozenset()  # same second chunk, other prefix


def test_only_candidates_are_chosen_and_forgotten_replicas_hold_nothing():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=16)
    index.insert(SYSTEM, "a")
    index.insert(SYSTEM, "b")
    assert index.match(SYSTEM, ["b", "c"]).replicas == {"b"}
    index.forget(["b"])
    assert index.match(SYSTEM, ["b", "c"]).replicas == frozenset()
    assert index.match(SYSTEM, ["a"]).replicas == {"a"}
    index.forget(["a"])
    assert len(index) == 0


def test_short_prompts_and_an_empty_index_match_nothing():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=64)
    assert index.match(SYSTEM, ["a"]).replicas == frozenset()
    index.insert("short", "a")
    assert len(index) == 0 and index.match("short", ["a"]).matched_chars == 0


def test_memory_is_bounded_by_forgetting_the_oldest_chunks():
    index: PrefixIndex[str] = PrefixIndex(chunk_chars=4, max_chunks=10)
    index.insert("old!" * 8, "a")
    for i in range(10):
        index.insert(f"n{i:02d}!" + "new!" * 3, "b")
    assert len(index) == 10
    assert index.match("old!" * 8, ["a"]).replicas == frozenset()  # evicted
    assert index.match("n09!new!", ["b"]).replicas == {"b"}
    with pytest.raises(ValueError, match="chunk_chars"):
        PrefixIndex(chunk_chars=0)


def test_routing_key_of_chat_and_completion_bodies():
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        ]
    }
    assert routing_key(chat) == "<system>Be brief.<user>Hi"
    assert routing_key({"prompt": "Once upon"}) == "Once upon"
    assert routing_key({"prompt": ["first", "second"]}) == "first"
    assert routing_key({"prompt": [1, 2, 3]}) == "1 2 3"
    for junk in (None, [], {"messages": "no"}, {"prompt": 5}, {"messages": [7, {"content": {"x": 1}}]}):
        assert routing_key(junk) in ("", "<>")
