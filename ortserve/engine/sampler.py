"""Logits -> next tokens, in numpy, vectorised over the batch (the pass of e^x over the vocabulary,
and its chunk sums, in the op library: ortserve/ops/sampling.py).

Order (as vLLM v1): the grammar's token mask (structured outputs), min_tokens masking of EOS and
stop ids, logit_bias, repetition / frequency / presence penalties, then greedy argmax or:
temperature, min-p, top-k, top-p, and a draw from the remaining distribution by inverse CDF with
one uniform number from the sample's own generator.
A sample's token depends only on its own logits row and its own generator, never on the batch.
Logprobs are taken from the raw logits, before any of the above (vLLM v1's default), so under a
grammar they still say what the model itself preferred. min_tokens never masks a grammar's only
way forward (a grammar that is complete allows only EOS).

Numerics cannot fail: a temperature below ``GREEDY_TEMPERATURE`` is greedy (as vLLM), and a row
whose processed distribution is not a finite positive mass (overflow from extreme parameters, NaN
logits, or masks that removed every token) falls back to the argmax of its processed logits,
NaN read as -inf; so every row yields a valid token id.

Penalties, as in vLLM: repetition divides positive logits and multiplies negative ones of every
token seen in the prompt or output; frequency subtracts ``f * count`` and presence ``p`` for every
token in the output.
"""

from __future__ import annotations

import numpy as np

from ortserve.engine.grammar import allowed_tokens
from ortserve.engine.ipc import TokenLogprob
from ortserve.engine.sequence import Sequence
from ortserve.ops.sampling import exp_chunk_sums

NEG_INF = np.float32(-np.inf)
CHUNK = 128  # inverse-CDF search granularity (see draw)
TINY_TOTAL, HUGE_TOTAL = 1e-30, 1e30  # unshifted weights outside these sums are redone with the max subtracted
TOP_P_CANDIDATES = 1024  # top-p looks for the nucleus among this many largest weights first


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    result: np.ndarray = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    return result


class Sampler:
    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None  # scratch for the weights, reused across steps

    def sample(
        self, logits: np.ndarray, seqs: list[Sequence], bitmask: np.ndarray | None = None
    ) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """One token per row of ``logits`` (float32 [len(seqs), vocab], modified in place).
        ``bitmask``: the grammar masks (int32 words, row i for seqs[i]; read where seqs[i] has a
        grammar)."""
        with np.errstate(all="ignore"):  # non-finite rows are caught and fall back (module doc)
            return self._sample(logits, seqs, bitmask)

    def _sample(
        self, logits: np.ndarray, seqs: list[Sequence], bitmask: np.ndarray | None
    ) -> tuple[list[int], list[TokenLogprob | None] | None]:
        params = [s.request.params for s in seqs]
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = log_softmax(logits[lp_rows]) if lp_rows else None
        allowed = self._apply_grammars(logits, seqs, bitmask) if bitmask is not None else {}
        self._apply_processors(logits, seqs, allowed)
        greedy = np.fromiter((p.greedy for p in params), dtype=bool, count=len(params))
        if greedy.all():
            tokens = logits.argmax(axis=1)
        elif not greedy.any():  # the runner's buffer is ours until the next step: no copy
            tokens = self._sample_random(logits, seqs)
        else:
            tokens = logits.argmax(axis=1)
            rows = np.flatnonzero(~greedy)
            tokens[rows] = self._sample_random(logits[rows], [seqs[i] for i in rows])
        token_list = tokens.tolist()
        if not lp_rows:
            return token_list, None
        assert raw_logprobs is not None
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)  # rows without logprobs asked get None
        for j, i in enumerate(lp_rows):
            logprobs[i] = _token_logprob(raw_logprobs[j], token_list[i], params[i].logprobs or 0)
        return token_list, logprobs

    def verify(
        self, logits: np.ndarray, seqs: list[Sequence], drafts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None] | None]:
        """Speculative decoding's check of draft tokens. Sequence i owns 1 + len(drafts[i])
        consecutive rows of ``logits``: the target's logits at its last token and at each draft.
        Returns per sequence the accepted drafts plus one token of the target's own: what decoding
        one token at a time gives under greedy sampling, and the same distribution under random
        sampling (rejection sampling: a draft x is kept with probability p(x) / q(x), q(x) = 1 for a
        deterministic proposal and the draft model's own distribution for a drawn one; on rejection
        the token is drawn from max(p - q, 0), i.e. p without x for a deterministic draft; after
        every draft is kept, a bonus token is drawn from the last row). Logprobs, when asked, are
        taken per emitted token from its row's raw logits, as ``sample``'s.

        Drafts are only proposed for requests without penalties or grammars (engine/speculative.py),
        so the processors here are the position-free ones, and min_tokens, which each row applies
        at its own output position."""
        with np.errstate(all="ignore"):
            return self._verify(logits, seqs, drafts)

    def _verify(
        self, logits: np.ndarray, seqs: list[Sequence], drafts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None] | None]:
        rows = [seq for seq, d in zip(seqs, drafts) for _ in range(len(d) + 1)]  # each row's sequence
        # row j of a sequence whose token_ids end in its d drafts predicts output token num_output - d + j
        offsets = [j - len(d) for d in drafts for j in range(len(d) + 1)]
        starts = np.concatenate([[0], np.cumsum([len(d) + 1 for d in drafts])])
        wants_logprobs = any(s.params.logprobs is not None for s in seqs)
        raw = log_softmax(logits) if wants_logprobs else None
        self._apply_processors(logits, rows, offsets=offsets)
        greedy_tokens = logits.argmax(axis=1)
        random = np.flatnonzero([not s.params.greedy for s in rows])
        weights = self._weights(logits[random], [rows[r] for r in random])[0] if random.size else None
        weight_row = {int(r): j for j, r in enumerate(random)}
        tokens: list[list[int]] = []
        for i, (seq, draft) in enumerate(zip(seqs, drafts)):
            first, out = int(starts[i]), []
            for j in range(len(draft) + 1):
                row = first + j
                if seq.params.greedy:
                    token = int(greedy_tokens[row])
                    out.append(token)
                    if j == len(draft) or token != draft[j]:
                        break
                    continue
                assert weights is not None
                w = weights[weight_row[row]]
                if j < len(draft) and self._keep_draft(w, seq, draft, j):
                    out.append(draft[j])
                    continue
                out.append(int(draw(w[None, :], np.array([seq.rng.random()]))[0]))
                break
            tokens.append(out)
        if raw is None:
            return tokens, None
        logprobs: list[list[TokenLogprob] | None] = [
            [_token_logprob(raw[int(starts[i]) + j], token, seq.params.logprobs or 0) for j, token in enumerate(out)]
            if seq.params.logprobs is not None
            else None
            for i, (seq, out) in enumerate(zip(seqs, tokens))
        ]
        return tokens, logprobs

    @staticmethod
    def _keep_draft(w: np.ndarray, seq: Sequence, draft: list[int], j: int) -> bool:
        """Rejection sampling of draft ``j`` against the target's weights ``w`` (unnormalised p):
        kept with probability p(x) / q(x), at most 1 (q(x) = 1 for a deterministic proposal). If
        rejected, ``w`` becomes what to draw from instead: p without x, or max(p - q, 0)."""
        token, total = draft[j], float(w.sum(dtype=np.float64))
        q = None if seq.draft_probs is None else seq.draft_probs[j]
        if seq.rng.random() * total * (1.0 if q is None else float(q[token])) < w[token]:
            return True
        if q is not None:
            residual = np.maximum(w / np.float32(total) - q, np.float32(0.0))
            if residual.sum(dtype=np.float64) > 0:  # else rounding: p and q agree, fall back below
                w[:] = residual
                return False
        w[token] = 0.0
        return False

    # -- logits processors -------------------------------------------------------------------
    @staticmethod
    def _apply_grammars(logits: np.ndarray, seqs: list[Sequence], bitmask: np.ndarray) -> dict[int, np.ndarray]:
        """-inf for every token a row's grammar forbids; the allowed sets by row."""
        allowed = {}
        vocab = logits.shape[1]
        for i, seq in enumerate(seqs):
            if seq.grammar is not None:
                allowed[i] = ok = allowed_tokens(bitmask[i], vocab)
                np.copyto(logits[i], NEG_INF, where=~ok)
        return allowed

    def _apply_processors(
        self,
        logits: np.ndarray,
        seqs: list[Sequence],
        allowed: dict[int, np.ndarray] | None = None,
        offsets: list[int] | None = None,
    ) -> None:
        """``offsets[i]``: row i predicts output token ``seqs[i].num_output_tokens + offsets[i]``
        (0 when not given; a draft's rows, in ``verify``)."""
        bias_rows, bias_ids, bias_values = [], [], []
        rep_rows, rep_ids, rep_pen = [], [], []
        out_rows, out_ids, out_sub = [], [], []
        for i, seq in enumerate(seqs):
            request = seq.request
            p = request.params
            position = seq.num_output_tokens + (offsets[i] if offsets else 0)
            if position < p.min_tokens and request.min_tokens_mask.size:
                ok = allowed.get(i) if allowed else None
                if ok is None or ok.sum() > ok[request.min_tokens_mask].sum():  # never the grammar's only way on
                    logits[i, request.min_tokens_mask] = NEG_INF
            if request.bias_ids.size:
                bias_rows.append(np.full(request.bias_ids.size, i))
                bias_ids.append(request.bias_ids)
                bias_values.append(request.bias_values)
            counts = seq.output_counts
            if counts is None:
                continue
            ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            if p.repetition_penalty != 1.0:
                assert request.prompt_uniques is not None  # kept whenever a repetition penalty is set
                seen = np.union1d(request.prompt_uniques, ids)
                rep_rows.append(np.full(seen.size, i))
                rep_ids.append(seen)
                rep_pen.append(np.full(seen.size, p.repetition_penalty, dtype=np.float32))
            if ids.size and (p.frequency_penalty or p.presence_penalty):
                num = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                out_rows.append(np.full(ids.size, i))
                out_ids.append(ids)
                out_sub.append(p.frequency_penalty * num + p.presence_penalty)
        if bias_rows:  # (row, token) pairs are unique, so fancy-index += is exact
            logits[np.concatenate(bias_rows), np.concatenate(bias_ids)] += np.concatenate(bias_values)
        if rep_rows:
            r, t, pen = np.concatenate(rep_rows), np.concatenate(rep_ids), np.concatenate(rep_pen)
            x = logits[r, t]
            logits[r, t] = np.where(x > 0, x / pen, x * pen)
        if out_rows:
            logits[np.concatenate(out_rows), np.concatenate(out_ids)] -= np.concatenate(out_sub).astype(np.float32)

    # -- random sampling ---------------------------------------------------------------------
    def _sample_random(self, x: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
        """``x``: processed logits of the non-greedy rows (modified in place)."""
        weights, chunk_sums = self._weights(x, seqs)
        u = np.fromiter((s.rng.random() for s in seqs), dtype=np.float64, count=len(seqs))
        return draw(weights, u, chunk_sums=chunk_sums)

    def _weights(self, x: np.ndarray, seqs: list[Sequence]) -> tuple[np.ndarray, np.ndarray]:
        """Unnormalised probabilities after temperature, min-p, top-k and top-p, and their sums
        over chunks of CHUNK tokens (what ``draw`` searches).

        Rows without truncation take exp of the scaled logits directly, skipping the max pass
        and the subtraction (two passes over the vocabulary); a row whose weights then overflow
        or all but vanish is redone with the max subtracted. Rows with truncation always
        subtract their max. Either way the choice depends on the row alone, never on the batch."""
        params = [s.request.params for s in seqs]
        vocab = x.shape[1]
        inv_t = np.array([1.0 / p.temperature for p in params], dtype=np.float32)
        if (inv_t != 1.0).any():
            x *= inv_t[:, None]
        truncated = [i for i, p in enumerate(params) if p.min_p > 0.0 or 0 < p.top_k < vocab or p.top_p < 1.0]
        fallback: dict[int, int] = {}  # rows whose shift below would lose their argmax
        if truncated:
            peaks = x[truncated].max(axis=1, keepdims=True)
            for j in np.flatnonzero(~np.isfinite(peaks[:, 0])):
                fallback[truncated[j]] = _nan_argmax(x[truncated[j]])
            x[truncated] -= peaks
        weights = self._scratch(x.shape)  # x stays intact: overflowing rows are redone
        chunk_sums = exp_chunk_sums(x, weights, CHUNK)  # e^x and its chunks' sums in one pass
        for i in truncated:
            p, row = params[i], weights[i]  # the row's largest weight is exactly 1
            if p.min_p > 0.0:
                row[row < p.min_p] = 0.0
            if 0 < p.top_k < vocab:
                kth = np.partition(row, vocab - p.top_k)[vocab - p.top_k]
                row[row < kth] = 0.0
        top_p_rows = [i for i in truncated if params[i].top_p < 1.0]
        if top_p_rows:
            top_p = np.array([params[i].top_p for i in top_p_rows], dtype=np.float64)
            weights[top_p_rows] = _keep_nucleus(weights[top_p_rows], top_p)
        starts = np.arange(0, vocab, CHUNK)
        if truncated:
            chunk_sums[truncated] = np.add.reduceat(weights[truncated], starts, axis=1)
        totals = chunk_sums.sum(axis=1, dtype=np.float64)
        redo = np.flatnonzero(~((totals > TINY_TOTAL) & (totals < HUGE_TOTAL)))
        if redo.size:
            shifted = x[redo] - x[redo].max(axis=1, keepdims=True)
            weights[redo] = np.exp(shifted)
            chunk_sums[redo] = np.add.reduceat(weights[redo], starts, axis=1)
            totals = chunk_sums[redo].sum(axis=1, dtype=np.float64)
            for i in redo[~(np.isfinite(totals) & (totals > 0))]:
                weights[i] = 0.0  # no finite distribution: the processed argmax, NaN as -inf
                weights[i, fallback[i] if i in fallback else _nan_argmax(x[i])] = 1.0
                chunk_sums[i] = np.add.reduceat(weights[i], starts)
        return weights, chunk_sums

    def _scratch(self, shape: tuple[int, int]) -> np.ndarray:
        """A reused buffer for the weights (a fresh 6 MB array per step costs page faults)."""
        if self._buffer is None or self._buffer.shape[0] < shape[0] or self._buffer.shape[1] != shape[1]:
            self._buffer = np.empty((max(shape[0], 1), shape[1]), np.float32)
        return self._buffer[: shape[0]]


def _nan_argmax(row: np.ndarray) -> int:
    return int(np.argmax(np.where(np.isnan(row), -np.inf, row)))


def _keep_nucleus(w: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Zero all but the smallest set of largest weights holding ``top_p`` of each row's mass.
    The nucleus is looked for among the TOP_P_CANDIDATES largest weights first (a partition costs
    a third of a full sort); rows whose nucleus is wider fall back to a full sort."""
    total = w.sum(axis=1, dtype=np.float64)
    k = min(TOP_P_CANDIDATES, w.shape[1])
    candidates = np.partition(w, w.shape[1] - k, axis=1)[:, w.shape[1] - k :] if k < w.shape[1] else w
    desc = -np.sort(-candidates, axis=1)
    wide = desc.sum(axis=1, dtype=np.float64) < top_p * total
    threshold = np.empty(len(w), w.dtype)
    if not wide.all():
        narrow = ~wide
        threshold[narrow] = _nucleus_threshold(desc[narrow], top_p[narrow], total[narrow])
    if wide.any():
        threshold[wide] = _nucleus_threshold(-np.sort(-w[wide], axis=1), top_p[wide], total[wide])
    w[w < threshold[:, None]] = 0.0
    return w


def _nucleus_threshold(desc: np.ndarray, top_p: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The smallest weight kept: tokens are kept while the mass before them is below top_p."""
    mass_before = (np.cumsum(desc, axis=1, dtype=np.float64) - desc) / total[:, None]
    keep = np.maximum((mass_before < top_p[:, None]).sum(axis=1), 1)
    threshold: np.ndarray = desc[np.arange(len(desc)), keep - 1]
    return threshold


def draw(weights: np.ndarray, u: np.ndarray, chunk: int = CHUNK, chunk_sums: np.ndarray | None = None) -> np.ndarray:
    """Per row, the token where the cumulative weight first exceeds ``u * total`` (u in [0, 1)).

    A full cumsum over the vocabulary is sequential and slow in numpy (about 4.5 ms for 32 x 49152),
    so the search is two-level and vectorised over rows: cumulate chunk sums to find each row's
    chunk, then cumulate inside that chunk only. Zero-weight tokens are never drawn."""
    rows = np.arange(len(u))
    vocab = weights.shape[1]
    starts = np.arange(0, vocab, chunk)
    if chunk_sums is None:
        chunk_sums = np.add.reduceat(weights, starts, axis=1)
    chunk_cdf = np.cumsum(chunk_sums, axis=1, dtype=np.float64)
    targets = u * chunk_cdf[:, -1]
    k = np.minimum((chunk_cdf <= targets[:, None]).sum(axis=1), len(starts) - 1)
    rest = targets - np.where(k > 0, chunk_cdf[rows, k - 1], 0.0)
    offsets = starts[k][:, None] + np.arange(chunk)
    segment = weights[rows[:, None], np.minimum(offsets, vocab - 1)]
    segment[offsets >= vocab] = 0.0  # a short last chunk
    j = np.minimum((np.cumsum(segment, axis=1, dtype=np.float64) <= rest[:, None]).sum(axis=1), chunk - 1)
    for i in np.flatnonzero(segment[rows, j] == 0.0):  # rounding put the target past the last positive weight
        j[i] = np.flatnonzero(segment[i])[-1]
    tokens: np.ndarray = starts[k] + j
    return tokens


def prompt_token_logprobs(logits: np.ndarray, targets: np.ndarray, k: int) -> list[TokenLogprob]:
    """Logprobs of ``targets[i]`` under row i of ``logits`` (the prompt's next tokens), with ranks
    and each row's top ``k``: the same record as a sampled token's."""
    rows = log_softmax(logits)
    index = np.arange(len(rows))
    chosen = rows[index, targets]
    ranks = (rows > chosen[:, None]).sum(axis=1) + 1
    tops: list[list[tuple[int, float]]] = [[] for _ in index]
    if k:
        ids = np.argpartition(-rows, k - 1, axis=1)[:, :k]
        values = np.take_along_axis(rows, ids, axis=1)
        order = np.argsort(-values, axis=1, kind="stable")
        ids, values = np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return [TokenLogprob(lp, rank, top) for lp, rank, top in zip(chosen.tolist(), ranks.tolist(), tops)]


def _token_logprob(row: np.ndarray, token: int, k: int) -> TokenLogprob:
    value = row[token]
    rank = int((row > value).sum()) + 1
    top: list[tuple[int, float]] = []
    if k:
        ids = np.argpartition(-row, k - 1)[:k]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        top = list(zip(ids.tolist(), row[ids].tolist()))
    return TokenLogprob(float(value), rank, top)
