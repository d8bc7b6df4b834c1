"""Speculative decoding by prompt lookup: guess the next tokens from what came before.

When the output repeats its input (an editor asking to rewrite a function with one change, a
model quoting its context), the tokens after the current n-gram's earlier occurrence are a good
draft. The engine verifies a draft in one batched step and keeps the longest prefix the model
agrees with, so the output is the model's own; only its speed changes.

Verifying costs more than a single-token step (every drafted position needs its logits), so
the draft length adapts: it doubles while drafts are fully accepted, shrinks to what was
accepted otherwise, and after a draft is rejected outright drafting pauses for a few steps.

Why at most 3 drafted tokens: a step of 1 + 3 rows is the best value per token (starter
model, 2-core x86: 1 row 21.5 ms, 4 rows 31.5 ms, 5-7 rows 46-53 ms), and on some CPUs
llama.cpp's matrix kernels compute batches of up to 7 rows like single rows (at 8 they switch
to a faster kernel that rounds differently); how a batch rounds depends on the CPU's
instruction set. Attention is the other half: flash attention computes a single-token step
over 512 or more cells with a split-KV kernel whose reduction rounds differently from the
multi-row kernel that verifies a draft, so on the CPU it is off by default
(runtime.llama.flash_attn_type). Measured on the starter's code edit: identical to plain
decoding without flash attention on AVX-512 and AVX2-only builds; with a q8_0 KV cache (which
needs flash attention) the text parts at token 259, at a near tie. Where greedy text parts,
it parts only where two tokens nearly tie (tests/test_engine_real.py).

Whether a step verifies drafts at all is decided by cost (``DraftPolicy``): the sequences being
decoded together already fill rows, and where an extra row is dear (a 4-row step costs 2.8
times a 1-row step on a 2-core AVX2 CPU) drafting for several busy sequences loses more than it
wins. What a step costs also depends on how llama.cpp splits it (``graph_rows``): with a KV
cache split by sequence it computes equal rows of consecutive sequences in one graph, so one
sequence's draft beside three others' single rows is a second graph that reads every weight
again (4 + 3 rows: 100 ms there, against 49 ms for the 4 rows alone). The engine learns what a
graph of each number of rows, and each split it met, takes on this machine (``StepCosts``) and
how often each sequence's drafts are accepted, and verifies the drafts that raise the expected
tokens per second of the step. A draft it does not verify is checked against the tokens that
follow anyway (a shadow draft), so the acceptance rate stays current at no cost.

The same costs decide which sequences take a step at all. llama.cpp computes one row's logits
with a matrix-vector kernel and two or more rows' with matrix kernels that do far less per
row at two or three (starter, 2-core x86, AVX2 or AVX-512: its 262,144-token output layer
takes 7 ms for one row, 19 ms for two, 27 for four; a step of one sequence 13 ms, of two 30 ms,
of four 40 ms; with a core busy, two 50 ms against one 15 ms). Two or three sequences can
then decode faster taking turns, a step of one row each, than together, and each gets its
tokens sooner as well. ``DraftPolicy.stepping`` lets the sequences that waited longest take
the step where fewer of them give more tokens per second than all (by ``DRAFT_MARGIN``); a
step of fewer sequences not measured lately is taken once in ``EXPLORE_STEPS`` to measure it.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

NGRAM_SIZES = (4, 3, 2)
"""Try the longest n-gram first: a longer match predicts the continuation better."""
INDEX_CHUNK = 256
"""Positions of the prompt indexed per draft, the latest first. The first draft comes in the
step right after the prompt was read, before that step hands over the first token: indexing
a 1,300-token chat there at once took 1-2.4 ms of the 5th turn's time to first token (2-core
AVX2), and it grows with the prompt. The latest text is where a copy most often comes from
(the code the last message quoted); a copy of older text drafts a few steps later."""
MIN_DRAFT = 2
MAX_DRAFT = 3
EXACT_ROWS = 7
"""Largest batch that llama.cpp's CPU matrix kernels compute with the single-row kernels (on
some CPUs exactly like single rows; on others they round apart at near ties). Not the logits:
on x86 builds with llamafile's tinyBLAS (the default) the output layer takes two or more rows
through it, so a verified draft's log-probabilities differ from a one-row step's in the third
decimal (0.0045 seen, AVX-512)."""
PRIOR_ACCEPTANCE = 0.5
"""The share of drafted tokens expected to be accepted before any draft has been checked."""
ACCEPTANCE_WEIGHT = 0.3
"""Weight of the latest draft in a sequence's acceptance rate (an exponential average: the
rate follows the text within a few drafts, as it moves from quoting to writing anew)."""
PRIOR_EXTRA_ROW = 0.15
"""Cost of a graph's extra row, as a share of the cheapest measured graph, for row counts not
measured yet (measured on the starter, 2-core x86: 4 rows 1.46x a 1-row step with AVX-512,
2.8x with AVX2 only). Optimistic on purpose: graphs of that size then get measured when
they run, where a pessimistic guess would never try them."""
COST_SAMPLES = 9
"""A split's cost is the median of its latest steps: one step slowed by another process
does not swing the decision."""
MIN_SAMPLES = 3
"""A split measured fewer times than this is not trusted to be dearer than the others
suggest: one step that another process slowed cannot turn drafting off."""
COST_HORIZON = 200
"""Steps after which a split's cost measured before is forgotten (the machine's load, the
thread count and the context length change it): a step not taken meanwhile, with drafts or
without, is then taken once to measure it again, at most one step in this many."""
DRAFT_MARGIN = 0.05
"""Drafts are verified only where they raise the step's expected tokens per second by this
share: the acceptance rate and the step costs are estimates (a run's steps vary by 10-20% on
a laptop), and a gain of 2% on paper was as often a loss (two sequences, 2-core AVX2)."""
N_UBATCH = 512
"""llama.cpp's largest graph (the engine's n_ubatch: 512, or 256 for a model whose window
attention weighs, on a CPU: planner.shrinks_window_cache). The decode steps split here have a
few rows a sequence, which either size splits alike."""
EXPLORE_STEPS = 64
"""A decode step of fewer sequences than are running, whose cost is not measured lately, is
taken once in this many steps to measure it (``DraftPolicy.stepping``)."""

Split = tuple[int, ...]
"""The rows of each graph llama.cpp computes for one decode step, in order."""


def graph_rows(parts: Sequence[tuple[int, int]], n_ubatch: int = N_UBATCH) -> Split:
    """How llama.cpp splits a batch into graphs when its KV cache is split by sequence (each
    slot its own cells: llama_batch_allocr::split_equal, sequential): each graph takes the
    same number of rows from a run of consecutive sequence ids, the run starting at the first
    sequence in batch order that has rows left. ``parts`` are (sequence id, rows) in batch
    order, each sequence's rows together. Sequences {0, 2} decode as two graphs of one row;
    {0, 1, 2, 3} with a 3-token draft on 0 as 4 rows, then 3."""
    left = [[seq, n] for seq, n in parts if n > 0]
    graphs: list[int] = []
    while left:
        run = [left[0]]
        for part in left[1:]:
            if part[0] == run[-1][0] + 1:
                run.append(part)
        per = min(min(n for _, n in run), max(1, n_ubatch // len(run)))
        for part in run:
            part[1] -= per
        graphs.append(per * len(run))
        left = [part for part in left if part[1] > 0]
    return tuple(graphs)


class PromptLookup:
    """Drafts for one sequence from an index of its own tokens (prompt and output)."""

    def __init__(self, tokens: list[int], shared: Acceptance | None = None) -> None:
        self.history: list[int] = list(tokens)
        # n-gram -> the position right after its latest occurrence. An n-gram is indexed only
        # once a token follows it, so the current tail never matches itself. The positions
        # indexed are ``range(self._lo, self._hi)``: each draft indexes the new tokens, and
        # INDEX_CHUNK more of the prompt, the latest first (see INDEX_CHUNK).
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}
        self._lo = self._hi = max(len(self.history), 1)
        # Where the last draft was copied from, and how long the history was then: a copy
        # keeps following its source rather than the latest look-alike n-gram.
        self._source: int | None = None
        self._source_len = 0
        self.draft_len = MIN_DRAFT
        self._pause = 0
        self._misses = 0
        self._shared = shared
        self.acceptance = shared.rate if shared is not None else PRIOR_ACCEPTANCE
        """The recent share of this sequence's drafted tokens that were accepted."""
        self._shadow: list[int] = []
        self._shadow_len = 0
        self._shadow_hits = 0

    def extend(self, tokens: list[int]) -> None:
        self.history.extend(tokens)
        for token in tokens:
            if not self._shadow:
                break
            if token == self._shadow[0]:
                self._shadow.pop(0)
                self._shadow_hits += 1
                if not self._shadow:
                    self.feedback(self._shadow_len, self._shadow_hits)
            else:
                self._shadow = []
                self.feedback(self._shadow_len, self._shadow_hits)

    def shadow(self, draft: list[int]) -> None:
        """Check ``draft`` (not verified) against the tokens that follow, as a verification
        would have: it counts towards the acceptance rate and the draft length alike."""
        self._shadow, self._shadow_len, self._shadow_hits = list(draft), len(draft), 0

    def _update_index(self) -> None:
        """Index the positions added since the last draft, and the next INDEX_CHUNK of the
        older ones. A position is the end of the n-grams just before it."""
        history = self.history
        for n, index in self._index.items():
            index.update(_ngrams(history, n, self._hi, len(history)))
        self._hi = len(history)
        if self._lo > 1:
            lo = max(self._lo - INDEX_CHUNK, 1)
            for n, index in self._index.items():
                older = dict(_ngrams(history, n, lo, self._lo))  # the latest of them wins
                for ngram, end in older.items():
                    index.setdefault(ngram, end)  # where indexed already, it came later
            self._lo = lo

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens predicted to follow the history ([] when none, and while a
        shadow draft is being checked). ``draft_len`` of them is what the acceptance of the
        last drafts suggests; the policy may verify more where a step of more rows costs
        less (four rows can cost less than three: see ``StepCosts``)."""
        if self._shadow:
            return []
        if self._pause > 0:
            self._pause -= 1
            return []
        if limit <= 0:
            return []
        self._update_index()
        history = self.history
        start = None
        if self._source is not None:
            follow = self._source + len(history) - self._source_len
            m = min(NGRAM_SIZES[0], follow)
            if 0 < follow < len(history) and history[follow - m:follow] == history[-m:]:
                start = follow  # still copying the same passage
        if start is None:
            for n in NGRAM_SIZES:
                if len(history) >= n:
                    start = self._index[n].get(tuple(history[-n:]))
                    if start is not None:
                        break
        if start is None:
            self._source = None
            return []
        self._source, self._source_len = start, len(history)
        return history[start:start + limit]

    def feedback(self, drafted: int, accepted: int) -> None:
        """Adapt the draft length to how much of the last draft the model accepted."""
        self.acceptance += ACCEPTANCE_WEIGHT * (accepted / drafted - self.acceptance)
        if self._shared is not None:
            self._shared.update(drafted, accepted)
        if accepted == drafted:
            self.draft_len = min(self.draft_len * 2, MAX_DRAFT)
            self._misses = 0
        elif accepted == 0:
            self._misses += 1
            self.draft_len = MIN_DRAFT
            self._pause = min(2 ** self._misses, 32)  # back off while drafts keep failing
        else:
            self.draft_len = max(MIN_DRAFT, accepted + 1)
            self._misses = 0


def _ngrams(history: list[int], n: int, lo: int, hi: int) -> Iterator[tuple[tuple[int, ...], int]]:
    """(the n-gram that ends just before ``end``, ``end``) for each ``end`` in [lo, hi) that
    has n tokens before it, in order: built by ``zip`` of shifted slices, several times
    faster than a slice per position."""
    lo = max(lo, n)
    if hi <= lo:
        return iter(())
    columns = [history[lo - n + i:hi - n + i] for i in range(n)]  # each hi - lo long
    return zip(zip(*columns, strict=True), range(lo, hi), strict=True)


class Acceptance:
    """The share of drafted tokens accepted, across every sequence: the rate a new sequence's
    drafts are expected to have before any of its own has been checked."""

    def __init__(self) -> None:
        self.rate = PRIOR_ACCEPTANCE

    def update(self, drafted: int, accepted: int) -> None:
        self.rate += ACCEPTANCE_WEIGHT * (accepted / drafted - self.rate)


class StepCosts:
    """What a decode step takes on this machine by how llama.cpp splits it (``Split``), learnt
    from the steps the engine runs: the median of each split's latest ``COST_SAMPLES``, of
    those taken in the last ``horizon`` steps. A split not measured is estimated as the sum of
    its graphs, each from the steps of one graph measured (one graph of n rows reads the
    weights once, whatever the sequences)."""

    def __init__(self, horizon: int = COST_HORIZON) -> None:
        self.horizon = horizon
        self._steps = 0
        self._samples: dict[Split, deque[tuple[int, float]]] = {}
        self._median: dict[Split, float] = {}
        self._trusted: dict[Split, float] = {}
        """The medians of the splits measured at least ``MIN_SAMPLES`` times."""
        self._graphs: dict[int, float] = {}
        """One graph's cost by its rows, from the steps of one graph: what estimates use."""

    def record(self, split: int | Split, seconds: float) -> None:
        """One step of this split (a row count: one graph) took ``seconds``."""
        split = _split(split)
        self._steps += 1
        samples = self._samples.setdefault(split, deque(maxlen=COST_SAMPLES))
        samples.append((self._steps, seconds))
        oldest = self._steps - self.horizon
        self._median, self._trusted = {}, {}
        for key, taken in self._samples.items():
            recent = [t for step, t in taken if step > oldest]
            if recent:
                self._median[key] = statistics.median(recent)
                if len(recent) >= MIN_SAMPLES:
                    self._trusted[key] = self._median[key]
        self._graphs = {key[0]: t for key, t in (self._trusted or self._median).items()
                        if len(key) == 1}

    def has(self, split: int | Split) -> bool:
        return _split(split) in self._median

    def seconds(self, split: int | Split) -> float:
        """The expected time of a step of this split (a row count: one graph). A split not
        measured lately is the sum of its graphs, each interpolated between the measured
        one-graph row counts, beyond them extended by ``PRIOR_EXTRA_ROW`` of a 1-row graph
        per row (in units of one 1-row graph while nothing is measured). A measured graph may
        cost less than a smaller one: llama.cpp computes repacked weights four rows at a time
        (on a 2-core AVX2 CPU 3 rows cost 45 ms, 4 rows 38). A split measured fewer than
        ``MIN_SAMPLES`` times counts at most what the others suggest."""
        split = _split(split)
        trusted = self._trusted or self._median
        if split in trusted:
            return trusted[split]
        estimate = sum(self._estimate(self._graphs, rows) for rows in split)
        if split in self._median:  # measured, too few times to be trusted
            return min(self._median[split], estimate)
        return estimate

    @staticmethod
    def _estimate(known: dict[int, float], rows: int) -> float:
        if not known:
            return 1.0 + PRIOR_EXTRA_ROW * (rows - 1)
        below = [r for r in known if r < rows]
        above = [r for r in known if r > rows]
        smallest = min(known)
        one_row = known[smallest] / (1.0 + PRIOR_EXTRA_ROW * (smallest - 1))
        if rows in known:
            return known[rows]
        if below and above:
            lo, hi = max(below), min(above)
            return known[lo] + (known[hi] - known[lo]) * (rows - lo) / (hi - lo)
        if below:
            lo = max(below)
            return known[lo] + PRIOR_EXTRA_ROW * one_row * (rows - lo)
        return one_row * (1.0 + PRIOR_EXTRA_ROW * (rows - 1))


def _split(split: int | Split) -> Split:
    return (split,) if isinstance(split, int) else tuple(split)


@dataclass(frozen=True)
class Draft:
    """One sequence's proposed draft for this step."""

    tokens: Sequence[int]
    acceptance: float
    """The expected share of its tokens the model accepts (the sequence's recent rate)."""
    forced: bool = False
    """The request asked for speculation: verify it whatever the cost."""
    preferred: int | None = None
    """How many of its tokens the lookup suggests (``PromptLookup.draft_len``): what a
    forced draft verifies, and a draft not verified is checked for (None: all)."""

    @property
    def suggested(self) -> int:
        return len(self.tokens) if self.preferred is None else min(self.preferred,
                                                                   len(self.tokens))


class DraftPolicy:
    """Decides each step which drafts to verify: those that raise the step's expected tokens
    per second, from the measured cost of a step by how it splits into graphs (``StepCosts``,
    ``graph_rows``) and each draft's expected acceptance. The rows of every sequence decoding
    count: with four sequences, a draft makes a step of 4 + 3 rows (two graphs), not 1 + 3."""

    def __init__(self, costs: StepCosts | None = None) -> None:
        self.costs = costs or StepCosts()
        self.acceptance = Acceptance()
        self._since_explore = 0

    def stepping(self, seq_ids: Sequence[int], waited: Sequence[int]) -> list[int]:
        """Which of the sequences being decoded take this step (indices into ``seq_ids``, in
        batch order): all of them, or the ones that have waited longest where a step of fewer
        of them gives more tokens per second. ``waited[i]``: steps since ``seq_ids[i]`` last
        decoded. Taking turns longest-waiting first, each sequence steps at least once in
        every ``len(seq_ids)`` steps, and whenever taking turns gives more tokens per second
        in all, each sequence gets its tokens sooner too (see the module's docstring)."""
        n = len(seq_ids)
        everyone = list(range(n))
        if n < 2:
            return everyone
        full = graph_rows([(seq, 1) for seq in seq_ids])
        if not self.costs.has(full):
            return everyone  # what fewer sequences are weighed against
        self._since_explore += 1
        longest = sorted(everyone, key=lambda i: (-waited[i], i))
        best, best_rate = everyone, n / self.costs.seconds(full) * (1 + DRAFT_MARGIN)
        for k in range(n - 1, 0, -1):
            chosen = sorted(longest[:k])
            split = graph_rows([(seq_ids[i], 1) for i in chosen])
            if not self.costs.has(split):
                if self._since_explore >= EXPLORE_STEPS:
                    self._since_explore = 0
                    return chosen  # once, to measure it
                continue
            rate = k / self.costs.seconds(split)
            if rate > best_rate:
                best, best_rate = chosen, rate
        return best

    def choose(self, seq_ids: int | Sequence[int], drafts: Sequence[Draft | None],
               budget: int) -> list[int]:
        """How many tokens of each draft to verify (0: none), at most ``budget`` in all, in a
        step that decodes one row for each of ``seq_ids`` (in batch order; a count n: ids 0 to
        n-1). ``drafts[i]`` is the draft of ``seq_ids[i]`` (None, or a shorter list: none)."""
        seqs = list(range(seq_ids)) if isinstance(seq_ids, int) else list(seq_ids)
        proposed = {i: d for i, d in enumerate(drafts) if d is not None and d.tokens}
        # The likeliest drafts first. Weighed: each prefix of them, each draft cut to the
        # same length (1 to MAX_DRAFT tokens). A step's cost is not monotone in its rows:
        # equal rows of consecutive sequences share a graph, and a graph of four rows can
        # cost less than one of three.
        order = sorted(proposed, key=lambda i: -proposed[i].acceptance)

        def rate(lengths: list[int]) -> float:
            split = graph_rows([(seq, 1 + (lengths[i] if i < len(lengths) else 0))
                                for i, seq in enumerate(seqs)])
            tokens = len(seqs) + sum(d.acceptance * lengths[i] for i, d in proposed.items())
            return tokens / self.costs.seconds(split)

        forced = [0] * len(drafts)
        left = budget
        for i in order:
            if proposed[i].forced and left > 0:
                forced[i] = min(proposed[i].suggested, left)
                left -= forced[i]
        if not self.costs.has(graph_rows([(seq, 1) for seq in seqs])):
            return forced  # the step without drafts first: what drafts are weighed against
        best, best_rate = forced, rate(forced) * (1 + DRAFT_MARGIN)
        free = [i for i in order if not proposed[i].forced]
        for cap in range(1, MAX_DRAFT + 1):
            trial, room = list(forced), left
            for i in free:
                k = min(cap, len(proposed[i].tokens), room)
                if k <= 0:
                    break
                trial[i], room = k, room - k
                trial_rate = rate(trial)
                if trial_rate > best_rate:
                    best, best_rate = list(trial), trial_rate
        return best

    def drafts(self, seq_ids: Sequence[int], lookups: Sequence[PromptLookup | None],
               rooms: Sequence[int], forced: Sequence[bool], budget: int) -> list[list[int]]:
        """Each sequence's draft for this step (in batch order): what its prompt lookup
        proposes, at most ``rooms[i]`` tokens, where ``choose`` finds the step's expected tokens
        per second gain by it (``forced[i]``: the request asked for speculation); a draft not
        verified is checked as a shadow draft (``PromptLookup.shadow``)."""
        proposals: list[Draft | None] = []
        for lookup, room, force in zip(lookups, rooms, forced, strict=True):
            draft = lookup.draft(room) if lookup is not None else []
            proposals.append(Draft(draft, lookup.acceptance, forced=force,
                                   preferred=lookup.draft_len)
                             if lookup is not None and draft else None)
        chosen: list[list[int]] = [[] for _ in proposals]
        if not any(proposals):
            return chosen
        lengths = self.choose(seq_ids, proposals, budget)
        for i, (lookup, proposal, k) in enumerate(zip(lookups, proposals, lengths,
                                                      strict=True)):
            if proposal is None:
                continue
            if k:
                chosen[i] = list(proposal.tokens[:k])
            else:
                assert lookup is not None  # it proposed the draft
                lookup.shadow(list(proposal.tokens[:proposal.suggested]))
        return chosen
