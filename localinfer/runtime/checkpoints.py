"""What a slot's KV cache keeps for the requests after the one using it.

A new request takes the free slot whose cache serves it best (``slot_score``) and reuses the
prefix it shares with it, less the last REREAD_TAIL tokens. Where a sliding-window cache cannot
be cut back that far, a checkpoint of the window layers (``Backend.seq_checkpoint``) taken at
the right length returns the cache there: where an autocomplete prompt parts from the last one,
where a chat turn and its reply begin. After a chat reply, once the engine is idle, the
template's opening of the next user turn is read into the slot ahead of it (``read_ahead``).
With a prefix cache on disk (disk_cache.py), a request whose prompt starts with a saved prefix
longer than what its slot holds gets that prefix's state back, and the prefixes worth keeping
are saved where its reading reaches them. It also keeps the running sequences' caches in
consecutive slots (``compact``) and puts the caches of an interrupted step right
(``after_interrupt``). The engine (engine.py) holds one ``CacheKeeper`` and asks it at
admission, after each prompt chunk, after each step, at a reply's end and while idle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from ..errors import LocalInferError, StepInterrupted, WorkerLost
from .backend import Backend
from .disk_cache import PrefixCache, Saved
from .generation import Request
from .prompt_cache import common_prefix
from .slots import Checkpoint, Slot
from .speculate import EXACT_ROWS
from .types import FinishReason

log = logging.getLogger(__name__)
T = TypeVar("T")

CHECKPOINT_MIN_TOKENS = 64
"""An autocomplete prompt that shares fewer tokens than this with the slot's cache takes no
checkpoint (a few MB of sliding-window state for little saved)."""
REREAD_TAIL = EXACT_ROWS + 1
"""Prompt tokens read again even when cached. llama.cpp's CPU matrix kernels compute batches of
1-7 rows one way and of 8 or more another, which rounds differently: re-reading only the last
token gave a different greedy reply than a cold read to the same prompt in 5 of 24 tries
(starter model), re-reading 8 in none. 8 rows cost ~15 ms more than one on a fully cached
prompt, nothing on a new chat turn. Not exact either way: once a slot has passed the sliding
window cache's size (Gemma 3: 1,024 cells), its cells hold positions out of order, attention
sums them in another order, and a cached prompt can part from a cold read at a near-tie. Nor
for every prompt: the last token's logits after 8 rows re-read differed from a cold read's for
10 of the 40 lengths from 9 to 48 tokens of one text, none of 61, 97, 130, 200 and 333 (2-core
AVX2, at 1 and 2 threads alike)."""

READ_AHEAD_IDLE_S = 0.3
"""After a chat reply, once the engine has been idle this long, the chat template's opening of
the next user turn (Gemma: ``<end_of_turn>\n<start_of_turn>user\n``, 5 tokens) is read into
that slot's cache (``CacheKeeper.read_ahead``), so the next turn reads only its own message: 5
of the ~20 tokens a short question takes (starter, ~4 ms each on a 2-core CPU). A person reads
the reply and types for longer than this; a script that sends its next request at once finds
the engine as it was, and reads those tokens with its prompt."""

DEFAULT_CHAT_CHECKPOINTS = 2
"""Checkpoints a chat's slot keeps on a window cache (see ``CacheKeeper._chat``) where the
engine is not told how many: loading.py passes the planner's CHAT_CHECKPOINTS, whose memory
the plan counts; an engine built without a plan (tests, benchmarks) keeps as many."""


def slot_score(slot: Slot, request: Request, backend: Backend
               ) -> tuple[bool, bool, int, bool, float]:
    """Which free slot a request should take: the one its editor's previous keystroke used
    (an autocomplete prompt shares its prefix, often less than half of it, and the checkpoint
    there), else one whose cached tokens it mostly shares, that holds its whole prompt, or
    whose last prompt it holds whole and keeps (the longest such prefix wins), else the least
    recently used of those that are empty or keep the little they share with it (a new chat's
    template opening: on a sliding-window cache only a short sequence can be cut back that
    far, or back to a checkpoint within the shared prefix), else the least recently used, so
    that a small shared prefix (a common system prompt) does not evict a long cached
    conversation. A prompt cached whole is one asked again (a regenerated reply, a client
    retrying, several clients asking alike): what it drops there is the reply that followed
    it, which the asker is replacing. A prompt that holds the slot's last prompt whole is that
    conversation's next turn: what it drops is the rest of the reply it resends, whose text
    is tokenized anew, and not always as it was sampled (the starter sampled "=" "?", read
    back as "=?", 26 tokens into a 300-token reply; with seven empty slots the daemon's next
    turn took one and read the whole conversation again). (llama-server takes the slot
    holding the largest share of a new prompt, and keeps what it drops in host memory.)
    Another completion of a prompt (``Request.follows``) rides on its leader's rows and copies
    its cache only where it parts from it: it takes an empty slot, else the least recently
    used (a finished one's slot counts as never used where it parted: its cache repeats its
    leader's)."""
    if request.follows is not None:  # it copies its prompt: an empty or the stalest cache
        return False, False, 0, not slot.cached, -slot.last_used
    key = request.params.supersede
    target = request.target
    common = common_prefix(slot.cached, target)
    n_keep = min(common, len(target) - REREAD_TAIL)
    keeps = not slot.cached or (n_keep > 0 and (
        backend.can_cut(len(slot.cached), n_keep) or any(
            0 < len(c.tokens) <= n_keep and c.tokens == target[:len(c.tokens)]
            for c in slot.checkpoints)))
    # Its own reply's start too: a side request that only repeats the prompt (a "summarize
    # the above" completion) does not take the conversation's reply away.
    next_turn = keeps and 0 < slot.reply_start < common
    keeps_most = 2 * common >= len(slot.cached) or (common > 0 and common == len(target)) \
        or next_turn
    return (key is not None and slot.supersede == key, keeps_most,
            common if keeps_most else 0, keeps, -slot.last_used)


def waits(request: Request, slots: list[Slot]) -> bool:
    """Whether ``request`` waits for the one it follows (``Request.follows``) to read their
    prompt, whose cache it then copies (``Engine._admit_followers``)."""
    first = request.follows
    if first is None or first.generated or first.ended or first.generation.cancelled:
        return False
    return not any(s.req is first and len(s.cached) >= len(first.prompt) for s in slots)


class CacheKeeper:
    """The checkpoints and the read-ahead of one engine's slots."""

    def __init__(self, backend: Backend, *, n_ctx: int, chat_checkpoints: int,
                 turn_marks: Callable[[], tuple[list[int], list[int]] | None],
                 disk: PrefixCache | None = None) -> None:
        self.backend = backend
        self.disk = disk
        """The prefix cache on disk, or None."""
        self.n_ctx = n_ctx
        self.chat_checkpoints = chat_checkpoints
        """How many checkpoints a chat's slot keeps on a window cache (the plan's)."""
        self._turn_marks = turn_marks
        """(the tokens a chat prompt ends with, the next user turn's opening), or None:
        ``PromptBuilder.chat_turn_marks``."""

    def reuse(self, slot: Slot, request: Request, slots: list[Slot]) -> int:
        """Cut ``slot``'s cache to what ``request`` (just admitted there) reuses of it, keep the
        checkpoints of its prompt and plan the ones it takes: how many tokens it keeps. Another
        completion of a prompt first copies the cache of the slot that read it (``slots``)."""
        target = request.target
        if request.follows is not None:
            self.copy_shared(slot, target, slots)
        # The last REREAD_TAIL tokens are always read again (at least the last one must
        # be, for its logits): then the last token's logits come from a batch of as many
        # rows as when the prompt is read cold, and a cached prompt gives the same greedy
        # text as a cold one (see REREAD_TAIL).
        common = common_prefix(slot.cached, target)
        n_keep = self._cut(slot, min(common, max(0, len(target) - REREAD_TAIL)), target)
        slot.save_at, slot.save_prompt = [], 0
        if self.disk is not None:
            n_keep = self._from_disk(slot, request, n_keep)
        del slot.cached[n_keep:]
        slot.turn_start = n_keep
        slot.reply_start = len(request.prompt)
        kept: list[Checkpoint] = []
        dropped: list[Checkpoint] = []
        for c in slot.checkpoints:  # those of another prompt go
            (kept if c.tokens == target[:len(c.tokens)] else dropped).append(c)
        if dropped:
            slot.checkpoints, slot.spare = kept, dropped[-1].state  # the newest: largest
        slot.checkpoint_at = None
        if request.params.supersede is None and self.backend.cut_reach:
            self._chat(slot, n_keep, len(request.prompt) - REREAD_TAIL)
        # An autocomplete request: the next keystroke's prompt differs from this one at or
        # after where the text typed at the cursor begins (a FIM prompt's ``cursor``), else
        # where this one differs from the last (the cursor moves on), so the cache as it is
        # there is worth keeping: past the reply that follows, a window cache could not be
        # cut back to it (a 1,400-token prompt then read whole at every burst's first key).
        at = request.cursor if request.cursor is not None else common
        if request.params.supersede is not None and self.backend.needs_checkpoints and \
                CHECKPOINT_MIN_TOKENS <= at <= len(target) - REREAD_TAIL:
            slot.checkpoint_at = at
            self.take_due(slot)
        return n_keep

    def copy_shared(self, slot: Slot, target: list[int], slots: list[Slot]) -> None:
        """In ``reuse``, first: where another slot's cache holds at least CHECKPOINT_MIN_TOKENS
        more of ``target`` than ``slot``'s (the prompt another completion of it has just read:
        ``Request.follows``, admitted after its leader went on), copy that cache into
        ``slot`` through host memory (~30 MB for a 1,500-token prompt of the starter,
        milliseconds; reading it takes seconds here)."""
        here = common_prefix(slot.cached, target)
        source = max(slots, key=lambda s: common_prefix(s.cached, target))
        if common_prefix(source.cached, target) >= here + CHECKPOINT_MIN_TOKENS:
            self.copy(slot, source)  # where it cannot, the prompt is read instead

    def copy(self, slot: Slot, source: Slot) -> bool:
        """Copy ``source``'s cache into ``slot`` (whole, through host memory), with no
        checkpoint or save planned in it: whether it did. Where llama.cpp refused to load it,
        ``slot``'s cache is empty."""
        n = len(source.cached)
        state = self._host_copy(lambda: self.backend.seq_save(source.seq_id, n),
                                "could not copy a sequence's cache")
        if state is None:
            return False
        slot.checkpoints, slot.spare, slot.checkpoint_at = [], None, None
        slot.save_at, slot.save_prompt = [], 0
        if self.backend.seq_load(slot.seq_id, state, n):
            slot.cached[:] = source.cached
            slot.turn_start, slot.reply_start = n, source.reply_start
            return True
        slot.cached.clear()
        return False

    def forget(self, slot: Slot) -> None:
        """Empty ``slot``'s cache, its checkpoints and its read-ahead: a cache cleared, or
        another completion's, which repeats its leader's (and, copied whole, holds only the
        sliding window there, which cannot be cut back)."""
        self.backend.seq_trim(slot.seq_id, 0)
        slot.cached.clear()
        slot.checkpoints, slot.spare, slot.checkpoint_at, slot.ahead = [], None, None, []
        slot.reply_start = 0

    def _from_disk(self, slot: Slot, request: Request, n_keep: int) -> int:
        """Restore the longest saved prefix of the request's target longer than the slot's
        ``n_keep`` tokens, and plan the saves of its prompt (on its first admission): how many
        tokens the slot's cache holds now."""
        disk = self.disk
        assert disk is not None  # asked only with a prefix cache
        target = request.target
        try:
            found = disk.lookup(target, n_keep)
        except OSError as exc:  # an unreadable directory: the request reads its prompt
            log.warning("prefix cache: cannot look up saved prefixes: %s", exc)
            found = None
        if found is not None:
            entry, saved = found
            n = entry.n_tokens
            if self._load(slot, saved, n):
                # A whole prompt saved (``first_token``): its tail is read again.
                n = self.backend.seq_trim(slot.seq_id, min(n, len(target) - REREAD_TAIL))
                disk.restored(n)
                slot.cached[:] = target[:n]
                slot.checkpoints, slot.spare = [], None
                if request.sampler is None:
                    request.n_restored = n
                n_keep = n
            else:  # refused by llama.cpp: the cache is empty now
                disk.store.discard(entry, "llama.cpp refused its state")
                slot.cached.clear()
                slot.checkpoints, slot.spare = [], None
                n_keep = 0
        if request.sampler is None:  # its first admission
            marks = self._turn_marks()
            try:
                points = disk.plan(request.prompt, marks[1][0] if marks else None,
                                   request.params.cache_prompt)
            except OSError as exc:
                log.warning("prefix cache: cannot list saved prefixes: %s", exc)
                points = []
            if n_keep in points and (
                    disk.cut_back and n_keep == len(request.prompt) - REREAD_TAIL
                    or self._window_at(slot, n_keep) is not None):
                slot.save_prompt = n_keep  # held already: saved after its first token
            elif n_keep in points:
                self._save(slot, request.prompt[:n_keep])
            slot.save_at = [n for n in points if n > n_keep]
        return n_keep

    def first_token(self, slot: Slot, flush: Callable[[], None]) -> None:
        """After each sampled token: at the running request's first, save its prompt where
        that was put off (``save_prompt``; the cache holds just the prompt until the next
        step), once ``flush`` has sent the token, which the copy must not delay: the whole
        prompt where a state can be cut back, else with the checkpoint of its window layers
        where the prefix ends."""
        n, prompt = slot.save_prompt, slot.running.prompt
        if not n or slot.running.n_generated != 1:
            return
        slot.save_prompt = 0
        if len(slot.cached) != len(prompt):
            return
        assert self.disk is not None  # planned only with a prefix cache
        if self.disk.cut_back:
            flush()
            self._save(slot, list(slot.cached))
        elif (window := self._window_at(slot, n)) is not None:
            flush()
            self._save(slot, prompt[:n], window)

    @staticmethod
    def _window_at(slot: Slot, n: int) -> Checkpoint | None:
        """The slot's checkpoint of exactly its first ``n`` cached tokens, or None."""
        return next((c for c in slot.checkpoints
                     if len(c.tokens) == n and c.tokens == slot.cached[:n]), None)

    def _save(self, slot: Slot, tokens: list[int], window: Checkpoint | None = None) -> None:
        """Save the slot's cache, which holds ``tokens`` (or, with the checkpoint ``window``
        taken where they end, more), to the prefix cache on disk."""
        disk = self.disk
        assert disk is not None  # asked only with a prefix cache
        n_full = len(tokens) if window is None else len(slot.cached)
        copied = self._host_copy(lambda: (
            self.backend.seq_save(slot.seq_id, n_full),
            None if window is None else self.backend.checkpoint_data(window.state)),
            "prefix cache: could not copy a sequence's cache")
        if copied is not None and copied[0] is not None:
            disk.save(tokens, Saved(copied[0], n_full, copied[1]))

    @staticmethod
    def _host_copy(copy: Callable[[], T], what: str) -> T | None:
        """``copy()`` (a sequence's state into host memory), or None where llama.cpp could
        not (out of memory: ``what`` is logged, and the cache goes on without the copy); a
        lost worker process stops the engine (``failed``), whose owner reloads it."""
        try:
            return copy()
        except WorkerLost:
            raise
        except LocalInferError as exc:
            log.warning("%s: %s", what, exc)
            return None

    def _load(self, slot: Slot, saved: Saved, n: int) -> bool:
        """Put back a state saved for a prefix of ``n`` tokens: whether the slot's cache
        holds the prefix (or, a whole prompt saved where states cut back, more) now."""
        if not self.backend.seq_load(slot.seq_id, saved.state, saved.n_full):
            return False
        if saved.window is None:
            return True
        window = self.backend.checkpoint_state(saved.window)
        return self.backend.seq_restore(slot.seq_id, n, n, window) == n

    def _cut(self, slot: Slot, n_keep: int, target: list[int]) -> int:
        """Cut the slot's cache to ``n_keep`` tokens, or to its longest checkpoint within
        them where a sliding window cannot be cut there: how many tokens it keeps."""
        fits = [c for c in slot.checkpoints
                if 0 < len(c.tokens) <= n_keep and c.tokens == target[:len(c.tokens)]]
        if fits:
            best = max(fits, key=lambda c: len(c.tokens))
            return self.backend.seq_restore(slot.seq_id, n_keep, len(best.tokens), best.state)
        return self.backend.seq_trim(slot.seq_id, n_keep)

    def take_due(self, slot: Slot) -> None:
        """Take the checkpoint planned where the slot's cache now ends (``checkpoint_at``),
        and the save to disk (``save_at``)."""
        if slot.save_at and slot.save_at[0] == len(slot.cached):
            slot.save_at.pop(0)
            self._save(slot, list(slot.cached))
        if slot.checkpoint_at == len(slot.cached):
            slot.checkpoint_at = None
            if not slot.checkpoints or slot.checkpoints[-1].tokens != slot.cached:
                self.save(slot)

    def save(self, slot: Slot) -> None:
        """Save the slot's window layers as they are now, into the memory of the oldest
        checkpoint, which this one replaces, or of one dropped before."""
        # One a slot where only autocomplete keeps them (a large model's: ~120 MB each).
        keep = self.chat_checkpoints if self.backend.cut_reach else 1
        reuse, slot.spare = slot.spare, None
        if len(slot.checkpoints) >= keep:
            reuse = slot.checkpoints[0].state
            slot.checkpoints = slot.checkpoints[len(slot.checkpoints) - keep + 1:]
        state = self._host_copy(lambda: self.backend.seq_checkpoint(slot.seq_id, reuse),
                                "could not save a checkpoint of a sequence's cache")
        if state is None:
            return
        slot.checkpoints = [*slot.checkpoints, Checkpoint(list(slot.cached), state)]

    def _chat(self, slot: Slot, n_keep: int, reply_start: int) -> None:
        """Checkpoints of a request that is not an autocomplete, on a window cache that can
        be cut back only ``Backend.cut_reach`` tokens: one where its reading begins
        (``n_keep``, now, before its first chunk) and, for a prompt longer than the reach,
        one where its reply will (``reply_start``: its last chunk then starts there). After
        a chat reply the first is taken while the engine is idle, once the next turn's opening
        is read (``read_ahead``): a turn that comes later finds it held.

        After a reply longer than the reach, the window has moved past both: a regenerated
        reply, an edited last message or a template that drops the last reasoning would
        read the whole conversation again (927-981 ms against 40-41 for the starter's
        616-token chat asked again after a 300-token reply). llama.cpp saves only the cells
        in the window, so a checkpoint returns to its own length only, as llama-server's
        context checkpoints do: the turn's beginning, from which a short message is read
        again, and the reply's beginning, which costs the prompt's reading one more step.
        A slot keeps ``chat_checkpoints`` (the planner's, which the plan counts).

        A checkpoint held up to REREAD_TAIL tokens before ``n_keep`` serves as the turn's:
        restored, it reads those few tokens again with the rest, as a cached prompt's tail
        is read again anyway, where taking another costs every such turn a copy of the
        window (0.6-1.2 ms for the starter) before its first token. Questions asked in turn
        after one conversation, which share a first word or two, take one checkpoint."""
        def held(lo: int, hi: int) -> bool:
            return any(lo <= len(c.tokens) <= hi for c in slot.checkpoints)

        if n_keep >= CHECKPOINT_MIN_TOKENS and not held(n_keep - REREAD_TAIL, n_keep):
            self.save(slot)
        if reply_start - n_keep > self.backend.cut_reach and \
                not held(reply_start, reply_start):
            slot.checkpoint_at = reply_start

    def next_turn_opening(self, slot: Slot, request: Request, reason: FinishReason
                          ) -> list[int]:
        """What to read into a finished chat request's slot ahead of the next turn: the
        template's opening of the next user turn (and the reply's last token where
        max_tokens cut it: sampled, not yet decoded). Nothing where the client's next prompt
        will not repeat this cache: a reply cut by a stop string (the client gets it without
        the stop text), one made under a grammar (tool calls come back rendered in another
        form), one ending in white space (templates trim it), a cancelled one."""
        generated = request.generated
        if not generated or request.params.grammar is not None:
            return []
        if reason == "stop" and self.backend.is_eog(generated[-1]):
            reply, unread = generated[:-1], []
        elif reason == "length" and request.params.max_tokens == len(generated):
            reply, unread = generated, generated[-1:]
        else:
            return []
        if not reply or len(slot.cached) != len(request.prompt) + len(reply) - len(unread):
            return []
        last = self.backend.token_bytes(reply[-1])
        marks = self._turn_marks()
        if marks is None or not last or last != last.rstrip():
            return []
        generation, opening = marks
        if request.prompt[-len(generation):] != generation:
            return []  # not a chat prompt (a completion, an infill)
        ahead = unread + opening
        fits = len(slot.cached) + len(ahead) < self.n_ctx and \
            len(ahead) <= self.backend.n_batch
        return ahead if fits else []

    def read_ahead(self, slots: list[Slot]) -> int:
        """Read idle slots' ``ahead`` tokens into their caches, in one step of at most a
        batch (no logits, no thread-count measurement: not a step like the others); any
        left over wait for the next idle moment. How many tokens it read."""
        reading: list[Slot] = []
        room = self.backend.n_batch
        for slot in slots:
            if slot.req is None and slot.ahead and len(slot.ahead) <= room:
                # A request that ended inside a draft leaves its rejected tokens' cells.
                kept = self.backend.seq_trim(slot.seq_id, len(slot.cached))
                if kept == len(slot.cached):
                    reading.append(slot)
                    room -= len(slot.ahead)
                else:  # a sliding window cut back further: the next request reads it
                    del slot.cached[kept:]
                    slot.ahead = []
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        for slot in reading:
            start = len(slot.cached)
            tokens.extend(slot.ahead)
            positions.extend(range(start, start + len(slot.ahead)))
            seq_ids.extend([slot.seq_id] * len(slot.ahead))
        if not tokens:
            return 0
        # A stop left from a step that ended before it took effect (a client that left during
        # its reply's last step) is not for this read; one asked during it keeps the caches.
        self.backend.clear_interrupt()
        try:
            self.backend.decode(tokens, positions, seq_ids, [False] * len(tokens))
        except WorkerLost:
            raise  # the model's process is gone: stop (``failed``), the owner reloads it
        except StepInterrupted:
            for slot in reading:
                self.backend.seq_trim(slot.seq_id, len(slot.cached))
            return 0
        except LocalInferError as exc:  # what these caches hold is unknown now: drop them
            log.warning("could not read the next turn's opening ahead: %s", exc)
            for slot in reading:
                self.backend.seq_trim(slot.seq_id, 0)
                slot.cached.clear()
                slot.ahead = []
            return 0
        for slot in reading:
            slot.cached.extend(slot.ahead)
            slot.ahead = []
            # Where the next turn's reading begins: taken now, not on its way to its first
            # token (see _chat); not in place of one of the last turn's own (a long
            # message's start and its reply's), which an edited message needs.
            if self.backend.cut_reach and len(slot.cached) >= CHECKPOINT_MIN_TOKENS and (
                    len(slot.checkpoints) < self.chat_checkpoints
                    or len(slot.checkpoints[0].tokens) < slot.turn_start):
                self.save(slot)
        return len(tokens)

    def compact(self, slots: list[Slot]) -> None:
        """Keep the ids of the sequences that decode consecutive. With a KV cache split by
        sequence, llama.cpp computes consecutive sequences' rows in one graph and every other
        run of them in a graph of its own (speculate.graph_rows), which reads every weight
        again: four sequences in slots 0, 2, 4 and 6 decode 1.55x slower than in slots 0-3
        (starter, 2-core AVX2). A prompt still being read is not one of them: an editor's
        cold file waiting while replies decode (slots.long_prompts_wait) sat between a chat
        and three completions, and each 4-row step took two graphs (55-78 ms against 40-45).
        So a decoding sequence outside the block trades caches with an idle slot or a prompt
        being read inside it, choosing the block that copies the fewest cached tokens: a copy
        of each (a few ms for a few thousand tokens), once, and the other cache is kept."""
        def decodes(slot: Slot) -> bool:
            return slot.req is not None and not slot.prefilling

        stepping = [s.seq_id for s in slots if decodes(s)]
        k = len(stepping)
        if k < 2 or stepping[-1] - stepping[0] + 1 == k:
            return

        def copied(start: int) -> int:
            return sum(len(s.cached) for s in slots
                       if decodes(s) != (start <= s.seq_id < start + k))

        start = min(range(len(slots) - k + 1), key=copied)
        outside = [s for s in slots if decodes(s) and not start <= s.seq_id < start + k]
        holes = [s for s in slots if not decodes(s) and start <= s.seq_id < start + k]
        for slot, hole in zip(outside, holes, strict=True):
            try:
                swapped = self.backend.seq_swap(slot.seq_id, hole.seq_id)
            except WorkerLost:
                raise  # the model's process is gone: stop (``failed``), the owner reloads it
            except LocalInferError as exc:  # nothing moved: the sequences decode apart
                log.warning("could not move a sequence's cache: %s", exc)
                return
            slot.exchange(hole)
            if not swapped:  # both caches are gone: the request reads its tokens back
                log.warning("could not move a sequence's cache; reading it again")
                for lost in (slot, hole):
                    lost.cached.clear()
                    lost.checkpoints, lost.spare = [], None
                    lost.ahead = []
                request = hole.running
                request.target = request.prompt + request.generated
                hole.next_token = None

    def after_interrupt(self, decoding: list[Slot], chunks: list[tuple[Slot, int]]
                        ) -> None:
        """A step stopped part way (``StepInterrupted``): a prompt being read keeps the
        micro-batches the step finished; a decoding sequence drops what the step wrote of it
        and feeds its next token again (or, where the cache cannot be cut there, reads back
        what it lost, as a preempted request does). The requests whose clients left end at
        the engine's next loop; the rest go on."""
        for slot in decoding:
            slot.draft = []
            kept = self.backend.seq_trim(slot.seq_id, len(slot.cached))
            if kept < len(slot.cached):
                del slot.cached[kept:]
                request = slot.running
                request.target = request.prompt + request.generated
                slot.next_token = None
        for slot, _ in chunks:
            start = len(slot.cached)
            target = slot.running.target
            read = self.backend.seq_length(slot.seq_id)
            # The prompt's last token is read again: its logits, which sample the first
            # token, went with the step.
            keep = min(read, len(target) - 1)
            if keep != read:
                read = self.backend.seq_trim(slot.seq_id, keep)
            if start < read:
                slot.cached.extend(target[start:read])
                self.take_due(slot)
            elif read < start:  # not what a stopped read leaves: keep what is certain
                kept = self.backend.seq_trim(slot.seq_id, read)
                del slot.cached[kept:]
