"""KV cache blocks: reference counts, the free queue, and the prefix cache. The only owner of
block state and of every Sequence's ``block_table``.

- A block holds ``block_size`` tokens of K and V for every layer (the runner owns the memory; here
  a block is an id).
- A block with ref_count 0 sits in the free queue. If it holds a full, computed block of some
  prefix it stays findable by its hash ("cached-idle") until the queue hands it out again: the
  queue is LRU, plain free blocks go to its head (reused first), cached ones to its tail.
- Prefix caching: the hash of a full block chains the hash of the block before it, so a hit on
  block i means the whole prefix up to block i matches. Hits are counted only for blocks whose KV
  is computed, and at least one prompt token is always recomputed (its logits are needed).
- The n samples of a request share the full blocks of their prompt: sample 0 computes it, the
  others take its blocks as computed blocks (``find_computed_blocks``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from ortserve.engine.sequence import Sequence


class HoldsBlocks(Protocol):
    """What allocation reads of a sequence (a draft model's sequences too, engine/draft.py)."""

    block_table: list[int]
    num_computed_tokens: int


class Block:
    __slots__ = ("block_hash", "block_id", "ref_count")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None  # set while the block is findable in the prefix cache


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head = next out
        self.cached: dict[bytes, int] = {}  # block hash -> block id
        self.num_registered: dict[object, int] = {}  # leading blocks of a sequence already hashed

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can take: free ones and cached-idle ones (evicted on use)."""
        return len(self.free_queue)

    @property
    def num_cached_idle_blocks(self) -> int:
        return sum(1 for b in self.free_queue if self.blocks[b].block_hash is not None)

    @property
    def num_free_blocks(self) -> int:
        return self.num_available_blocks - self.num_cached_idle_blocks

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def check_idle(self) -> None:
        """With no request alive, every block is free or cached-idle and the bookkeeping agrees.
        Raises AssertionError naming what leaked."""
        held = [b.block_id for b in self.blocks if b.ref_count != 0]
        assert not held, f"blocks still referenced with no request alive: {held[:10]}"
        assert self.num_free_blocks + self.num_cached_idle_blocks == self.num_blocks, (
            f"free {self.num_free_blocks} + cached-idle {self.num_cached_idle_blocks} != total {self.num_blocks}"
        )
        assert not self.num_registered, f"sequences still tracked: {list(self.num_registered)[:5]}"
        for block_hash, block_id in self.cached.items():
            assert self.blocks[block_id].block_hash == block_hash, f"prefix index points at block {block_id} wrongly"

    # -- allocation ----------------------------------------------------------------------------
    def find_computed_blocks(self, seq: Sequence) -> list[int]:
        """Blocks that already hold a computed prefix of ``seq`` (which holds no blocks yet): the
        longest prefix-cache hit, or for samples 1..n-1 at least the prompt blocks of sample 0.
        At least one token is always left to compute, since its logits are needed."""
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        if self.enable_prefix_caching:
            for i in range(max_blocks):
                block_id = self.cached.get(seq.full_block_hashes(i + 1, self.block_size)[i])
                if block_id is None:
                    break
                hits.append(block_id)
        leader = seq.request.sequences[0]
        if seq is not leader:
            shared = min(
                max_blocks,
                (seq.num_prompt_tokens - 1) // self.block_size,
                leader.num_computed_tokens // self.block_size,
                len(leader.block_table),
            )
            if shared > len(hits):
                return leader.block_table[:shared]
        return hits

    def allocate(self, seq: HoldsBlocks, num_new_tokens: int, cached_blocks: list[int] | tuple[int, ...] = ()) -> bool:
        """Make ``seq.block_table`` cover its computed tokens, the prefix hits ``cached_blocks``
        (appended first) and ``num_new_tokens`` more. False, changing nothing, if blocks run out."""
        block_table = seq.block_table
        num_tokens = seq.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_for(num_tokens) - len(block_table) - len(cached_blocks)
        revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if max(num_new_blocks, 0) + revived > len(self.free_queue):
            return False
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            block_table.append(block_id)
        for _ in range(num_new_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict the least recently used cached block
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            block_table.append(block_id)
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks of ``seq`` that are now full and computed, so later prompts reuse them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        start = self.num_registered.get(seq, 0)
        if num_full <= start:
            return
        hashes = seq.full_block_hashes(num_full, self.block_size)
        for i in range(start, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and hashes[i] not in self.cached:
                block.block_hash = hashes[i]
                self.cached[hashes[i]] = block.block_id
        self.num_registered[seq] = num_full

    def free(self, seq: HoldsBlocks) -> None:
        """Drop ``seq``'s references; blocks nobody holds go back to the queue at once."""
        for block_id in reversed(seq.block_table):  # a sequence's tail blocks are evicted first
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
        seq.block_table = []
        self.num_registered.pop(seq, None)
