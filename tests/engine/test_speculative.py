"""The n-gram proposer: drafts are what followed the longest (then most recent) earlier match of a
sequence's tail, checked against a direct search."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.engine.speculative import NgramProposer


def reference_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, by brute force: for n from max_n down, the latest earlier i whose n tokens
    equal the tail; the draft is what follows."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


def propose(tokens: list[int], k: int = 4, min_n: int = 1, max_n: int = 4) -> list[int]:
    return NgramProposer(k, min_n, max_n).propose(np.array(tokens, np.int64), k)


def test_a_repeated_phrase_is_continued_from_its_earlier_occurrence():
    text = [5, 6, 7, 8, 9, 10, 1, 2, 5, 6, 7]
    assert propose(text) == [8, 9, 10, 1]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # tail (3, 4): "3 4" once, then a lone "4" more recently; the two-token match decides
    tokens = [3, 4, 100, 101, 9, 4, 200, 3, 4]
    assert propose(tokens, k=2) == [100, 101]


def test_nothing_is_proposed_without_a_match_or_below_min_n():
    assert propose([1, 2, 3, 4]) == []
    assert propose([1, 2, 9, 2], min_n=2) == []
    assert propose([1, 2, 9, 2], min_n=1) == [9, 2]


def test_the_limit_caps_the_draft():
    tokens = [1, 2, 3, 4, 5, 1, 2]
    assert NgramProposer(4).propose(np.array(tokens, np.int64), limit=2) == [3, 4]
    assert NgramProposer(4).propose(np.array(tokens, np.int64), limit=0) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=60),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 5),
)
def test_matches_the_brute_force_definition(tokens, k, min_n, extra):
    max_n = min_n + extra - 1
    assert propose(tokens, k, min_n, max_n) == reference_propose(tokens, k, min_n, max_n)
