"""Speculation by cost: the draft policy, the step costs it learns, shadow drafts, and the engine
turning drafting on and off with the fake backend's step-cost model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localinfer.runtime import speculate
from localinfer.runtime.speculate import (
    EXPLORE_STEPS,
    MAX_DRAFT,
    MIN_SAMPLES,
    NGRAM_SIZES,
    PRIOR_ACCEPTANCE,
    PRIOR_EXTRA_ROW,
    Acceptance,
    Draft,
    DraftPolicy,
    PromptLookup,
    StepCosts,
    graph_rows,
)
from localinfer.runtime.types import SamplingParams

AVX2 = {1: 1.0, 2: 1.80, 3: 2.96, 4: 2.53, 5: 3.56, 6: 3.12, 7: 4.21, 8: 3.78}
"""Step seconds by rows as measured on a 2-core AVX2 CPU (starter model, one sequence): llama.cpp
computes its repacked Q4_K weights four rows at a time, so three rows cost more than four."""
CHEAP_ROWS = {1: 1.0, 2: 1.02, 3: 1.04, 4: 1.06, 5: 1.3, 6: 1.4, 7: 1.5}


def policy_with(costs: dict[int, float]) -> DraftPolicy:
    step_costs = StepCosts()
    for rows, seconds in costs.items():
        step_costs.record(rows, seconds)
    return DraftPolicy(step_costs)


# --- the step costs -------------------------------------------------------------------------
def test_step_costs_interpolate_and_extend_the_measured_rows():
    costs = StepCosts()
    assert costs.seconds(5) == pytest.approx(1.0 + 4 * PRIOR_EXTRA_ROW)  # nothing measured
    costs.record(1, 0.020)
    costs.record(4, 0.032)
    assert costs.seconds(4) == pytest.approx(0.032)
    assert costs.seconds(2) == pytest.approx(0.024)
    assert costs.seconds(6) == pytest.approx(0.032 + 2 * PRIOR_EXTRA_ROW * 0.020)
    # Measured cheaper than 3 rows (llama.cpp's repacked kernels take rows four at a time):
    # that is what it costs, not noise to be smoothed over.
    costs.record(3, 0.045)
    assert costs.seconds(3) == pytest.approx(0.045)
    assert costs.seconds(4) == pytest.approx(0.032)


def test_a_row_count_measured_once_is_not_trusted_to_be_dear():
    costs = StepCosts()
    for _ in range(3):
        costs.record(1, 0.020)
        costs.record(4, 0.032)
    costs.record(7, 0.500)  # one step slowed by another process
    assert costs.seconds(7) == pytest.approx(0.032 + 3 * PRIOR_EXTRA_ROW * 0.020)
    costs.record(7, 0.040)
    costs.record(7, 0.041)
    assert costs.seconds(7) == pytest.approx(0.041)


def test_a_step_slowed_by_another_process_does_not_move_the_cost():
    costs = StepCosts()
    for seconds in (0.020, 0.021, 0.019, 0.200, 0.020):
        costs.record(1, seconds)
    assert costs.seconds(1) == pytest.approx(0.020)


# --- the policy ---------------------------------------------------------------------------
def test_drafting_for_four_busy_sequences_where_rows_are_dear_is_off():
    policy = policy_with(AVX2)
    drafts = [Draft([1, 2, 3], 0.4) for _ in range(4)]
    assert policy.choose(4, drafts, budget=3) == [0, 0, 0, 0]


def test_one_sequence_with_cheap_rows_and_accepted_drafts_drafts():
    policy = policy_with(CHEAP_ROWS)
    assert policy.choose(1, [Draft([1, 2, 3], 0.8)], budget=6) == [3]


def test_drafting_depends_on_the_rows_the_batch_already_fills():
    # The same draft pays beside one sequence (rows 1 -> 4 cost 6% more) and not beside
    # four (rows 4 -> 7 cost 42% more).
    policy = policy_with(CHEAP_ROWS)
    assert policy.choose(1, [Draft([1, 2, 3], 0.3)], budget=6) == [3]
    assert policy.choose(4, [Draft([1, 2, 3], 0.3)] + [Draft([4], 0.3)] * 3,
                         budget=3) == [0, 0, 0, 0]


def test_a_lone_draft_beside_other_sequences_costs_a_graph_of_its_own():
    # Two sequences: a draft on one is a second graph (2 rows, then 2 more of the first
    # sequence's), which costs a whole step; equal drafts on both share one graph of 6 rows.
    policy = policy_with(CHEAP_ROWS)
    assert graph_rows([(0, 1), (1, 3)]) == (2, 2)
    assert graph_rows([(0, 3), (1, 3)]) == (6,)
    assert policy.choose(2, [None, Draft([3, 4], 0.9)], budget=5) == [0, 0]
    assert policy.choose(2, [Draft([1, 2], 0.5), Draft([3, 4], 0.9)], budget=5) == [2, 2]


def test_sequences_that_are_not_consecutive_decode_as_graphs_of_their_own():
    assert graph_rows([(0, 1), (2, 1)]) == (1, 1)
    assert graph_rows([(0, 1), (1, 1), (2, 1), (4, 1)]) == (3, 1)
    assert graph_rows([(0, 4), (1, 1), (2, 4), (3, 1)]) == (4, 3, 3)
    assert graph_rows([(3, 1), (0, 1), (1, 1)]) == (1, 2)  # a run follows the batch order
    assert graph_rows([(0, 300), (1, 300)]) == (512, 88)  # at most n_ubatch rows a graph
    policy = policy_with(CHEAP_ROWS)
    assert policy.choose([0, 2], [Draft([1, 2, 3], 0.9), None], budget=5) == [0, 0]
    policy.costs.record((1, 1), 2.0)  # measured first: what drafts are weighed against
    # The step splits the same with the draft or without: what decides is the rows it adds.
    assert policy.choose([0, 2], [Draft([1, 2, 3], 0.9), None], budget=5) == [3, 0]
    assert policy.costs.seconds((4, 1)) == pytest.approx(CHEAP_ROWS[4] + CHEAP_ROWS[1])


def test_falling_acceptance_turns_drafting_off():
    shared = Acceptance()
    lookup = PromptLookup([1, 2, 3], shared)
    policy = policy_with(AVX2)
    for _ in range(3):
        lookup.feedback(3, 3)
    assert policy.choose(1, [Draft([7, 8, 9], lookup.acceptance)], budget=6) == [3]
    for _ in range(6):
        lookup.feedback(3, 0)
    assert lookup.acceptance < 0.15
    assert policy.choose(1, [Draft([7, 8, 9], lookup.acceptance)], budget=6) == [0]
    assert shared.rate < PRIOR_ACCEPTANCE  # new sequences start from what was seen


def test_a_draft_is_verified_at_the_length_whose_step_costs_least_per_token():
    # Three rows cost more than four here: the lookup suggests two tokens, three are verified;
    # forced, it verifies the two the lookup suggests.
    policy = policy_with(AVX2)
    draft = [7, 8, 9]
    assert policy.choose(1, [Draft(draft, 0.85, preferred=2)], budget=6) == [3]
    assert policy.choose(1, [Draft(draft, 0.85, preferred=2, forced=True)], budget=6) == [2]
    assert policy.choose(1, [Draft(draft[:2], 0.95)], budget=6) == [1]  # 2 rows pay, 3 do not
    # A gain within the estimates' error (3% on paper) is not taken.
    assert policy.choose(1, [Draft(draft[:2], 0.85)], budget=6) == [0]


def test_forced_drafts_are_verified_even_where_they_lose():
    policy = policy_with(AVX2)
    lengths = policy.choose(4, [Draft([1, 2, 3], 0.1, forced=True), Draft([4], 0.1)],
                            budget=3)
    assert lengths == [3, 0]


def test_the_step_without_drafts_is_measured_before_drafts_are_weighed():
    policy = policy_with({4: 1.0})  # nothing known of the 1-row step
    assert policy.choose(1, [Draft([1, 2, 3], 1.0)], budget=6) == [0]
    policy.costs.record(1, 0.9)
    assert policy.choose(1, [Draft([1, 2, 3], 1.0)], budget=6) == [3]


def test_a_cost_not_measured_lately_is_measured_again():
    # Drafting lost when it was last measured; after the horizon that figure is forgotten,
    # the drafted step is tried again, and its new cost decides.
    policy = DraftPolicy(StepCosts(horizon=20))
    for _ in range(3):
        policy.costs.record(1, 1.0)
        policy.costs.record(4, 4.0)  # dear then (another process took the cores)
    drafts = [Draft([1, 2, 3], 0.9)]
    chosen = []
    for _ in range(20):
        lengths = policy.choose(1, drafts, budget=6)
        chosen.append(sum(lengths))
        policy.costs.record(1 + lengths[0], 1.0 if not lengths[0] else 1.2)
    assert chosen[:2] == [0, 0] and chosen[-1] == 3
    # The step without drafts is forgotten alike, and measured before drafts are weighed.
    policy = DraftPolicy(StepCosts(horizon=3))
    for rows in (1, 4, 4, 4):
        policy.costs.record(rows, CHEAP_ROWS[rows])
    assert policy.choose(1, [Draft([1, 2, 3], 0.9)], budget=6) == [0]


# --- which sequences step ----------------------------------------------------------------------
DEAR_LOGITS = {1: 0.013, 2: 0.030, 3: 0.044, 4: 0.040}
"""Step seconds by rows, one row for each sequence, as measured on a 2-core x86 CPU (starter, in
process and through the daemon): llama.cpp computes one row's logits with a matrix-vector
kernel, two or three rows' with matrix kernels that do far less per row there."""


def test_two_sequences_take_turns_where_two_rows_cost_more_than_two_steps_of_one():
    policy = policy_with(DEAR_LOGITS)
    assert policy.stepping([0, 1], waited=[1, 0]) == [0]  # the one that waited longer
    assert policy.stepping([0, 1], waited=[0, 1]) == [1]
    # Three sequences: two steps of one row (1 / 13 ms) beat one of three (3 / 44 ms).
    assert len(policy.stepping([0, 1, 2], waited=[2, 1, 0])) == 1
    # Four step together: 4 / 40 ms.
    assert policy.stepping([0, 1, 2, 3], waited=[3, 2, 1, 0]) == [0, 1, 2, 3]


def test_sequences_step_together_where_rows_are_cheap():
    policy = policy_with({rows: 0.013 * CHEAP_ROWS[rows] for rows in (1, 2, 3, 4)})
    for n in (2, 3, 4):
        assert policy.stepping(list(range(n)), waited=list(range(n))) == list(range(n))


def test_sequences_take_turns_fairly():
    policy = policy_with(DEAR_LOGITS)
    seqs, waited, counts = [0, 1, 2], [0, 0, 0], [0, 0, 0]
    for _ in range(30):
        chosen = policy.stepping(seqs, waited)
        for i in range(3):
            waited[i] = 0 if i in chosen else waited[i] + 1
            counts[i] += i in chosen
        assert max(waited) < len(seqs)
    assert max(counts) - min(counts) <= 1


def test_a_smaller_step_not_measured_is_taken_once_in_a_while_to_measure_it():
    policy = policy_with({2: 0.030})  # only the two sequences together measured
    chosen = [policy.stepping([0, 1], waited=[1, 0]) for _ in range(EXPLORE_STEPS)]
    assert chosen[:-1] == [[0, 1]] * (EXPLORE_STEPS - 1)  # estimated at 26 ms: no gain
    assert chosen[-1] == [0]  # tried once
    policy.costs.record(1, 0.013)
    assert policy.stepping([0, 1], waited=[0, 1]) == [1]  # measured: taking turns wins
    # Where it measured dear, the sequences go on together.
    policy = policy_with({2: 0.030})
    for _ in range(EXPLORE_STEPS):
        policy.stepping([0, 1], waited=[1, 0])
    policy.costs.record(1, 0.028)
    assert policy.stepping([0, 1], waited=[1, 0]) == [0, 1]


def test_the_step_of_every_sequence_is_measured_before_fewer_are_weighed():
    policy = policy_with({1: 0.013})
    assert policy.stepping([0, 1], waited=[1, 0]) == [0, 1]


# --- shadow drafts --------------------------------------------------------------------------
def test_a_shadow_draft_is_scored_against_the_tokens_that_follow():
    lookup = PromptLookup([5, 6, 7, 8, 5, 6, 7])
    lookup.draft_len = 3
    draft = lookup.draft(3)
    assert draft == [8, 5, 6]
    lookup.shadow(draft)
    assert lookup.draft(3) == []  # one draft at a time, verified or not
    before = lookup.acceptance
    lookup.extend([8])
    lookup.extend([5])
    assert lookup.acceptance == before  # not scored until it ends
    lookup.extend([9])  # the third token differs: 2 of 3 accepted
    assert lookup.acceptance == pytest.approx(before + 0.3 * (2 / 3 - before))
    assert lookup.draft_len == 3  # grown as after a verified draft with 2 accepted


# --- the prompt's index ---------------------------------------------------------------------
def latest_occurrences(history: list[int]) -> dict[int, dict[tuple[int, ...], int]]:
    """Each n-gram that a token follows, with the position right after its latest occurrence:
    what the index holds once the whole history is indexed."""
    index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}
    for end in range(1, len(history)):
        for n in NGRAM_SIZES:
            if end >= n:
                index[n][tuple(history[end - n:end])] = end
    return index


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(prompt=st.lists(st.integers(0, 4), max_size=60),
       added=st.lists(st.lists(st.integers(0, 4), max_size=3), max_size=12))
def test_the_index_holds_each_ngrams_latest_occurrence_while_it_fills(prompt, added):
    speculate_chunk = speculate.INDEX_CHUNK
    speculate.INDEX_CHUNK = 7  # a long prompt, in small lists
    try:
        lookup = PromptLookup(prompt)
        for tokens in added:
            lookup.extend(tokens)
            lookup.draft(MAX_DRAFT)
            # What is indexed is right: the latest occurrence (older ones come later).
            full = latest_occurrences(lookup.history)
            for n, index in lookup._index.items():
                assert index == {k: v for k, v in full[n].items() if v >= lookup._lo}
        for _ in range(len(prompt) // 7 + 1):
            lookup.draft(MAX_DRAFT)
        assert lookup._index == latest_occurrences(lookup.history)
    finally:
        speculate.INDEX_CHUNK = speculate_chunk


def test_a_long_prompt_is_indexed_a_chunk_per_draft_the_latest_first():
    old = [100 + i for i in range(3 * speculate.INDEX_CHUNK)]
    recent = [7, 8, 9, 10, 11]
    lookup = PromptLookup([1, 2, 3, 4, 5, 6] + old + recent + old[-2:] + [1, 2, 3])
    assert lookup.draft(3) == []  # its copy of [1, 2, 3] is older than the first chunk
    lookup = PromptLookup([1, 2, 3, 4, 5, 6] + old + recent + old[-2:] + [7, 8])
    assert lookup.draft(3) == [9, 10, 11]  # the recent text drafts at once
    lookup = PromptLookup([1, 2, 3, 4, 5, 6] + old + recent + old[-2:] + [1, 2, 3])
    drafts = [lookup.draft(3) for _ in range(4)]
    assert drafts[-1] == [4, 5, 6]  # all indexed after four drafts


# --- the engine, with the fake backend's step-cost model -----------------------------------
COPY = "COPY:" + " ".join(f"line{i} = value{i % 7} + offset" for i in range(20))


def copying(prompt: str) -> str:
    return prompt.split("COPY:")[-1]


def run_copies(engine, n: int, speculative: bool | None):
    params = SamplingParams(temperature=0, max_tokens=None, speculative=speculative)
    generations = [engine.complete(f"{i} {COPY}", params) for i in range(n)]
    return [g.result() for g in generations]


def drafted(done) -> int:
    return sum(d.timings.drafted_tokens for d in done)


def test_drafting_stays_on_where_extra_rows_are_cheap(fake_engine):
    engine = fake_engine(reply=copying, n_slots=1, step_cost_s=lambda rows: 0.01)
    forced = run_copies(engine, 1, True)
    adaptive = run_copies(engine, 1, None)
    assert adaptive[0].text == forced[0].text
    assert drafted(adaptive) > 0.5 * drafted(forced) > 50
    assert adaptive[0].timings.accepted_tokens > 0.8 * drafted(adaptive)


def test_drafting_turns_off_where_extra_rows_are_dear(fake_engine):
    # A 4-row step costs 46 times a 1-row step: drafts of fully accepted tokens still lose.
    engine = fake_engine(reply=copying, n_slots=1,
                         step_cost_s=lambda rows: 0.002 + 0.03 * (rows - 1))
    adaptive = run_copies(engine, 1, None)
    assert adaptive[0].usage.completion_tokens > 150
    # A few steps to measure it (each draft length's step MIN_SAMPLES times), of ~60.
    assert drafted(adaptive) <= 2 * MIN_SAMPLES * MAX_DRAFT
    # The drafts were there, and would have been accepted (checked as shadow drafts).
    assert engine.drafts.acceptance.rate > 0.5


def test_drafting_turns_off_only_when_several_sequences_fill_the_rows(fake_engine):
    # Steps of up to 4 rows cost alike, larger ones dear: one sequence drafts, four do not.
    engine = fake_engine(reply=copying, n_slots=4,
                         step_cost_s=lambda rows: 0.01 if rows <= 4 else 0.01 * (rows - 3) ** 2)
    alone = run_copies(engine, 1, None)
    together = run_copies(engine, 4, None)
    assert drafted(alone) > 50
    assert drafted(together) < 0.1 * drafted(alone)
    assert all(d.text == alone[0].text for d in together)


def test_two_streams_take_turns_where_two_rows_are_dear(fake_engine):
    # Two rows cost 4 times one (as with a core busy: 50 against 15 ms, and far from the
    # margin however a loaded test machine oversleeps): the streams alternate steps of one
    # row, fairly, and each gets the text it gets alone.
    engine = fake_engine(reply=copying, n_slots=2,
                         step_cost_s=lambda rows: 0.003 * (1.0 if rows == 1 else 2.0 * rows))
    alone = run_copies(engine, 1, False)
    backend = engine.backend
    backend.splits.clear()
    together = run_copies(engine, 2, False)
    assert [d.text for d in together] == [alone[0].text] * 2
    decoded = [split for split in backend.splits if sum(split) <= 2]
    assert sum(split == (1,) for split in decoded) > 0.8 * len(decoded)
    first, second = (d.timings for d in together)
    assert first.decode_tokens == second.decode_tokens > 100
    assert abs(first.decode_ms - second.decode_ms) < 0.2 * first.decode_ms


def test_two_streams_step_together_where_two_rows_are_cheap(fake_engine):
    engine = fake_engine(reply=copying, n_slots=2, step_cost_s=lambda rows: 0.002 * (
        1.0 + 0.1 * (rows - 1)))
    run_copies(engine, 1, False)
    backend = engine.backend
    backend.splits.clear()
    run_copies(engine, 2, False)
    decoded = [split for split in backend.splits if sum(split) <= 2]
    assert sum(split == (2,) for split in decoded) > 0.9 * len(decoded)
