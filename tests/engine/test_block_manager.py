"""Block manager: allocation, ref counts, the LRU free queue and the prefix hash chain."""

from __future__ import annotations

from engine_fakes import make_request

from ortserve.engine.block_manager import BlockManager


def admit(bm: BlockManager, request, index: int = 0):
    """Take computed blocks and allocate the rest of the sequence, as the scheduler does."""
    seq = request.sequences[index]
    hits = bm.find_computed_blocks(seq)
    num_computed = len(hits) * bm.block_size
    assert bm.allocate(seq, seq.num_tokens - num_computed, hits)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return seq, hits


def test_allocate_covers_tokens_and_refuses_without_changing_anything():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_request(range(10)).sequences[0]
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and bm.num_available_blocks == 1
    other = make_request(range(100, 109)).sequences[0]
    assert not bm.allocate(other, 9)  # needs 3, 1 left
    assert other.block_table == [] and bm.num_available_blocks == 1
    seq.num_computed_tokens = 10
    assert bm.allocate(seq, 2)  # 12 tokens still fit 3 blocks
    assert len(seq.block_table) == 3
    assert bm.allocate(seq, 3)  # 13 tokens need a 4th
    assert len(seq.block_table) == 4 and bm.num_available_blocks == 0


def test_free_returns_every_block_and_idle_invariant_holds():
    bm = BlockManager(num_blocks=8, block_size=4)
    seqs = [admit(bm, make_request(range(i * 10, i * 10 + 7)))[0] for i in range(3)]
    assert bm.num_available_blocks == 8 - 6
    for seq in seqs:
        bm.free(seq)
        assert seq.block_table == []
    bm.check_idle()
    assert bm.num_free_blocks + bm.num_cached_idle_blocks == bm.num_blocks
    assert bm.num_cached_idle_blocks == 3  # one full block each stays findable


def test_prefix_hit_returns_the_shared_full_blocks():
    bm = BlockManager(num_blocks=16, block_size=4)
    first, _ = admit(bm, make_request(list(range(14))))  # blocks: 3 full + 1 partial
    second_req = make_request(list(range(12)) + [99, 98, 97])
    second = second_req.sequences[0]
    hits = bm.find_computed_blocks(second)
    assert hits == first.block_table[:3]
    admit(bm, second_req)
    for block_id in hits:
        assert bm.blocks[block_id].ref_count == 2
    assert second.block_table[:3] == first.block_table[:3]
    assert second.block_table[3] != first.block_table[3]


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    admit(bm, make_request(range(8)))
    same = make_request(range(8)).sequences[0]
    assert len(bm.find_computed_blocks(same)) == 1  # block 2 would cover the last token


def test_hash_chain_needs_the_whole_prefix_to_match():
    bm = BlockManager(num_blocks=16, block_size=4)
    admit(bm, make_request([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # same second block, different first block: no hit on either
    other = make_request([0, 2, 3, 4, 5, 6, 7, 8, 9]).sequences[0]
    assert bm.find_computed_blocks(other) == []


def test_freed_cached_block_is_revived_by_a_hit():
    bm = BlockManager(num_blocks=4, block_size=4)
    first, _ = admit(bm, make_request(range(9)))
    cached = first.block_table[:2]
    bm.free(first)
    assert bm.num_cached_idle_blocks == 2
    again, hits = admit(bm, make_request(range(9)))
    assert hits == cached
    assert all(bm.blocks[b].ref_count == 1 for b in cached)
    assert all(b not in bm.free_queue for b in again.block_table)


def test_lru_eviction_takes_plain_free_blocks_first_then_the_oldest_cached():
    bm = BlockManager(num_blocks=6, block_size=2)
    old, _ = admit(bm, make_request([1, 2, 3]))  # 1 full block cached + 1 partial
    new, _ = admit(bm, make_request([7, 8, 9]))
    old_cached, new_cached = old.block_table[0], new.block_table[0]
    bm.free(old)
    bm.free(new)
    assert bm.num_cached_idle_blocks == 2
    taker = make_request(range(100, 108)).sequences[0]  # 4 blocks: 2 plain + 2 partial tails
    assert bm.allocate(taker, 8)
    assert old_cached not in taker.block_table and new_cached not in taker.block_table
    taker.num_computed_tokens = 8
    assert bm.allocate(taker, 2)  # a 5th block: evicts the least recently freed cached block
    assert old_cached in taker.block_table and new_cached not in taker.block_table
    assert bm.find_computed_blocks(make_request([1, 2, 3]).sequences[0]) == []
    assert bm.find_computed_blocks(make_request([7, 8, 9]).sequences[0]) == [new_cached]


def test_blocks_become_cached_only_once_computed():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_request(range(12)).sequences[0]
    assert bm.allocate(seq, 6)  # a chunk: 1 full block computed after this step
    seq.num_computed_tokens = 6
    bm.cache_full_blocks(seq)
    probe = make_request(range(12)).sequences[0]
    assert bm.find_computed_blocks(probe) == seq.block_table[:1]


def test_samples_of_one_request_share_prompt_blocks_even_without_prefix_caching():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    request = make_request(range(10), n=3)
    leader, _ = admit(bm, request)
    forks = request.fork()
    for fork in forks:
        shared = bm.find_computed_blocks(fork)
        assert shared == leader.block_table[:2]
        assert bm.allocate(fork, fork.num_tokens - 8, shared)
    for block_id in leader.block_table[:2]:
        assert bm.blocks[block_id].ref_count == 3
    assert len({s.block_table[2] for s in request.sequences}) == 3  # own tail blocks
    for seq in request.sequences:
        bm.free(seq)
    bm.check_idle()
    assert bm.num_cached_idle_blocks == 0


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    admit(bm, make_request(range(12)))
    assert bm.find_computed_blocks(make_request(range(12)).sequences[0]) == []
    assert bm.cached == {}
