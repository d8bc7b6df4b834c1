"""A scripted stand-in for llama.cpp, for fast tests of everything above the backend.

It implements the same low-level contract as the llama.cpp backend (batches of token/position/
sequence entries, per-sequence samplers, KV trimming) and checks it the way llama.cpp does:
a sequence's positions must be contiguous, and the context must not overflow. Its "model"
replies to each prompt with a scripted text (a string, or a function of the prompt text),
one word-piece per token, with optional delays per decode step and per prompt token, a step
cost by the number of rows (as a CPU whose extra rows are cheap or dear), and optionally a CPU
shared with other processes (``FakeCPU``) that makes a step's time depend on its thread count.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidRequest, LocalInferError, StepInterrupted
from .chat_template import BUILTIN_TEMPLATES
from .grammar import Grammar
from .speculate import graph_rows
from .types import ModelInfo, SamplingParams

_PIECE = re.compile(r"<[a-z_]+>|\s+|[^\s<]+|<")
_SPECIAL = re.compile(r"<[a-z_]+>")
EOS = "<eos>"
END_OF_TURN = "<end_of_turn>"

Reply = str | Callable[[str], str]


@dataclass
class FakeCPU:
    """A cost model of a CPU shared with other processes, for tests of the thread policy.

    A step's work divides among its threads. Once they and the other processes' busy threads
    outnumber the cores, each thread gets cores / (threads + busy) of a core and every
    barrier waits for one that was descheduled (``barrier_wait`` times longer): on 2 cores
    with one busy, 1 thread takes 1.0x and 2 threads 1.5x the time of 1 thread alone, as
    llama.cpp measured on such a machine (17.5 against 11.1 tok/s)."""

    cores: int = 2
    busy_cores: int = 0
    """Cores other processes keep busy; tests change it while the engine runs."""
    step_s: float = 0.01
    """One thread's time for a one-row step on an idle machine."""
    barrier_wait: float = 2.0
    _others_cpu_s: float = 0.0
    _clock: float | None = None

    def step_seconds(self, rows: int, threads: int) -> float:
        work = self.step_s * max(1, rows) ** 0.5
        if threads + self.busy_cores <= self.cores:
            return work / threads
        share = self.cores / (threads + self.busy_cores)
        return work / threads / share * self.barrier_wait

    def cpu_seconds(self) -> tuple[float, float]:
        """As runtime.threads.others_cpu_seconds: the other processes' CPU seconds so far
        (busy_cores for every second of wall time), and none for this process."""
        now = time.perf_counter()
        if self._clock is not None:
            self._others_cpu_s += self.busy_cores * (now - self._clock)
        self._clock = now
        return self._others_cpu_s, 0.0

    def running_now(self) -> int:
        """As runtime.threads.others_running_now: the other processes' busy threads."""
        return self.busy_cores


@dataclass
class _FakeSampler:
    """One request's sampler; it also holds the reply scripted for that request."""

    params: SamplingParams
    seed: int
    accepted: list[int] = field(default_factory=list)
    prompt_len: int = 0
    script: list[int] | None = None
    rescript: bool = False
    """A token was forced: the reply goes on from the text as it now stands."""


class FakeBackend:
    """A fake model: tokens are word pieces, the reply is scripted."""

    def __init__(
        self,
        reply: Reply = "Hello! I am a fake model, here to test you.",
        *,
        n_ctx: int = 2048,
        n_slots: int = 4,
        n_batch: int = 256,
        step_delay_s: float = 0.0,
        prompt_delay_s: float = 0.0,
        name: str = "fake:test",
        architecture: str = "gemma3",
        fim: bool = False,
        n_ctx_train: int | None = None,
        base_model: bool = False,
        chat_template: str | None = None,
        fim_repo: bool = False,
        fim_spm: bool = False,
        embedding_only: bool = False,
        n_embd: int = 16,
        embed_delay_s: float = 0.0,
        window: int | None = None,
        chat_checkpoints: bool = False,
        cpu: FakeCPU | None = None,
        step_cost_s: Callable[[int], float] | None = None,
        seeded: dict[int, str] | None = None,
    ) -> None:
        self.reply = reply
        self.seeded = seeded or {}
        """Replies by a request's seed, in place of ``reply``: completions of one prompt that
        write otherwise."""
        self.cpu = cpu
        self.adaptive_threads = cpu.cores if cpu is not None else 0
        self.threads = (self.adaptive_threads, self.adaptive_threads)
        """(n_threads, n_threads_batch) as last set."""
        self.thread_changes: list[tuple[int, int]] = []
        self.step_delay_s = step_delay_s
        self._interrupt = threading.Event()
        self.interrupted_calls = 0
        """Decodes stopped by ``interrupt``."""
        self.step_cost_s = step_cost_s
        """Seconds a graph of n decode rows (a token of each sequence and the drafts being
        verified) takes, on top of the delays above: a step of decode rows alone is split into
        graphs as llama.cpp splits it (speculate.graph_rows), one with a prompt being read
        counts its output rows as one graph."""
        self.prompt_delay_s = prompt_delay_s
        self.n_batch = n_batch
        self.fim_repo = ("<repo_name>", "<file_sep>") if fim_repo else None
        self.fim_spm = fim_spm
        self.longest_token = 0
        """``max_token_bytes``: 0, none known (a test sets one)."""
        self.n_ctx_embed = n_ctx
        self.n_embd = n_embd
        self.embed_delay_s = embed_delay_s
        self.embed_calls: list[int] = []  # inputs per embed call, for tests of batching
        self.window = window
        """As a sliding-window cache: a sequence cannot be cut back by more than this many
        tokens (it then drops all), except at a checkpoint."""
        self.needs_checkpoints = window is not None
        self.tokenizes_here = True
        self.cut_reach = window if window is not None and chat_checkpoints else 0
        self.restored: list[int] = []  # the positions checkpoints were restored at
        self.checkpoints_reused = 0  # checkpoints saved into the memory of a dropped one
        self.swaps: list[tuple[int, int]] = []  # the sequences whose caches traded places
        self.state_format = f"fake {name}"
        self.saved: list[int] = []  # lengths of the states seq_save returned
        self.loaded: list[int] = []  # lengths of the states seq_load put back
        self._lock = threading.Lock()
        self._vocab: dict[str, int] = {}
        self._pieces: list[str] = []
        # Control tokens print as nothing; any other <word> (Qwen's <think>) is text.
        self._control = ("<pad>", EOS, "<bos>", END_OF_TURN, "<start_of_turn>", "<fim_prefix>",
                         "<fim_suffix>", "<fim_middle>")
        for special in self._control[:5]:
            self._id(special)
        self._seqs: dict[int, list[int]] = {}
        self._outputs: dict[int, tuple[int, int]] = {}  # batch index -> (seq, position)
        self.decode_calls: list[int] = []  # batch sizes, for tests of the scheduler
        self.splits: list[tuple[int, ...]] = []
        """The graphs llama.cpp would compute for each decode call (speculate.graph_rows)."""
        self.forced: list[int] = []
        """Every token the engine forced (``force``), in order."""
        self.grammars: list[Grammar] = []
        """The grammar of each constrained request, in order: the fake does not sample, so
        tests check what the engine asked for (the real model's tests check the sampling)."""
        self.closed = False
        self.info = ModelInfo(
            name=name,
            path="(fake)",
            architecture=architecture,
            quant="F16",
            size_bytes=1_000_000,
            n_params=1_000_000,
            n_layers=4,
            n_gpu_layers=0,
            n_ctx_train=n_ctx_train or n_ctx,
            n_ctx=n_ctx,
            n_slots=n_slots,
            n_vocab=1000,
            chat_template=chat_template or BUILTIN_TEMPLATES["gemma"],
            bos_text="<bos>",
            eos_text=EOS,
            fim=("<fim_prefix>", "<fim_suffix>", "<fim_middle>") if fim else None,
            base_model=base_model,
            embedding_only=embedding_only,
        )

    # --- vocabulary -------------------------------------------------------------------------
    def _id(self, piece: str) -> int:
        with self._lock:
            token = self._vocab.get(piece)
            if token is None:
                token = self._vocab[piece] = len(self._pieces)
                self._pieces.append(piece)
            return token

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        tokens = [self._id(piece) for piece in _PIECE.findall(text)]
        return [self._id("<bos>")] + tokens if add_special else tokens

    def _piece(self, token: int) -> str:
        """Every id below ``n_vocab`` is a token, as in a real vocabulary: those no text has
        spelled yet are unused ones. (The list only grows: no lock needed to read it.)"""
        pieces = self._pieces
        return pieces[token] if token < len(pieces) else f"<unused{token}>"

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece(token)
        return b"" if piece in self._control else piece.encode()

    max_special_bytes = 32

    def max_token_bytes(self) -> int:
        return self.longest_token  # its words are tokens: no bound unless a test sets one

    def special_piece(self, token: int) -> bytes | None:
        # The pattern reads <word> whole, as llama.cpp reads special tokens.
        piece = self._piece(token)
        return piece.encode() if _SPECIAL.fullmatch(piece) else None

    def is_eog(self, token: int) -> bool:
        return self._piece(token) in (EOS, END_OF_TURN)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(self._piece(t) for t in tokens)

    # --- decoding ---------------------------------------------------------------------------
    def interrupt(self) -> None:
        self._interrupt.set()

    def clear_interrupt(self) -> None:
        self._interrupt.clear()

    def seq_length(self, seq_id: int) -> int:
        return len(self._seqs.get(seq_id, []))

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        self.threads = (n_threads, n_threads_batch)
        self.thread_changes.append(self.threads)

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[int],
        outputs: Sequence[bool],
    ) -> None:
        if not tokens or len(tokens) > self.n_batch:
            raise LocalInferError(f"fake decode: batch of {len(tokens)} tokens")
        self.decode_calls.append(len(tokens))
        split = graph_rows([(seq, len(list(group))) for seq, group in itertools.groupby(seq_ids)])
        self.splits.append(split)
        n_prompt = sum(1 for o in outputs if not o)
        delay = self.step_delay_s + self.prompt_delay_s * n_prompt
        if self.cpu is not None:
            delay += self.cpu.step_seconds(len(tokens), self.threads[len(tokens) > 1])
        if self.step_cost_s is not None:
            if n_prompt:
                delay += self.step_cost_s(len(tokens) - n_prompt)
            else:
                delay += sum(self.step_cost_s(rows) for rows in split)
        # Interruptible as llama.cpp's decode is: it stops within its delay, keeping nothing of
        # this step (as llama.cpp drops the micro-batch it stopped in).
        if self._interrupt.wait(delay) if delay else self._interrupt.is_set():
            self.interrupted_calls += 1
            raise StepInterrupted("fake decode: interrupted")
        self._outputs.clear()
        for i, (token, pos, seq) in enumerate(zip(tokens, positions, seq_ids, strict=True)):
            if not 0 <= seq < self.info.n_slots:
                raise LocalInferError(f"fake decode: sequence {seq} out of range")
            cells = self._seqs.setdefault(seq, [])
            if pos != len(cells):
                raise LocalInferError(
                    f"fake decode: sequence {seq} has {len(cells)} cells, got position {pos}"
                )
            if pos >= self.info.n_ctx:
                raise LocalInferError(f"fake decode: position {pos} beyond the context")
            cells.append(token)
            if outputs[i]:
                self._outputs[i] = (seq, pos)

    def new_sampler(self, params: SamplingParams, seed: int) -> _FakeSampler:
        if params.grammar is not None:
            self.grammars.append(params.grammar)
        return _FakeSampler(params, seed)

    def check_grammar(self, grammar: Grammar) -> None:
        if grammar.gbnf is None and not isinstance(grammar.schema_json, dict):
            raise InvalidRequest("the JSON schema cannot be turned into a grammar: a JSON"
                                 " schema must be an object")

    def accept(self, sampler: _FakeSampler, tokens: Sequence[int]) -> None:
        sampler.accepted.extend(tokens)

    def force(self, sampler: _FakeSampler, token: int) -> None:
        # The scripted reply (a function of the text so far) is asked again at the next
        # sample, as a model reads what was written in its place.
        self.forced.append(token)
        sampler.accepted.append(token)
        sampler.rescript = True

    def free_sampler(self, sampler: _FakeSampler) -> None:
        sampler.accepted.clear()

    def sample(self, sampler: _FakeSampler, index: int) -> int:
        seq, pos = self._outputs[index]
        if sampler.script is None:  # the first sample of a request: its prompt ends at pos
            sampler.prompt_len = pos + 1
            text = self.seeded.get(sampler.seed) or self._reply_to(
                self.detokenize(self._seqs[seq][: pos + 1]))
            sampler.script = self.tokenize(text, add_special=False) + [self._id(EOS)]
        k = pos + 1 - sampler.prompt_len
        if sampler.rescript:
            sampler.rescript = False
            text = self._reply_to(self.detokenize(self._seqs[seq][: pos + 1]))
            sampler.script = sampler.script[:k] + self.tokenize(text, add_special=False) + [
                self._id(EOS)]
        token = sampler.script[k] if k < len(sampler.script) else self._id(EOS)
        sampler.accepted.append(token)
        return token

    def _reply_to(self, prompt: str) -> str:
        return self.reply(prompt) if callable(self.reply) else self.reply

    def logits(self, index: int) -> list[float]:
        if index not in self._outputs:
            raise LocalInferError(f"fake logits: batch entry {index} has no output")
        return [0.0] * len(self._pieces)  # every token alike: the script alone decides

    def raw_logits(self, index: int) -> np.ndarray:
        # Every token alike, over a vocabulary that already holds the reply's pieces (the
        # sampler tokenizes the script only when it samples, after this).
        seq, pos = self._outputs[index]
        self.tokenize(self._reply_to(self.detokenize(self._seqs[seq][: pos + 1])),
                      add_special=False)
        return np.zeros(len(self._pieces), dtype=np.float32)

    def seq_trim(self, seq_id: int, start: int) -> int:
        cells = self._seqs.setdefault(seq_id, [])
        if self.window is not None and len(cells) - start > self.window:
            start = 0
        del cells[start:]
        return len(cells)

    def can_cut(self, n_cached: int, n_keep: int) -> bool:
        return self.window is None or n_cached - n_keep <= self.window

    def seq_swap(self, a: int, b: int) -> bool:
        self.swaps.append((a, b))
        self._seqs[a], self._seqs[b] = self._seqs.get(b, []), self._seqs.get(a, [])
        return True

    def seq_checkpoint(self, seq_id: int, reuse: list[int] | None = None) -> list[int]:
        # Written over in place, as llama.cpp's buffer is: a checkpoint the engine still
        # holds and passed as ``reuse`` by mistake then fails its restore.
        state = reuse if reuse is not None else []
        state[:] = self._seqs.get(seq_id, [])
        self.checkpoints_reused += reuse is not None
        return state

    def checkpoint_data(self, state: list[int]) -> bytes:
        return "\x00".join(self._piece(t) for t in state).encode()

    def checkpoint_state(self, data: Any) -> list[int]:
        return [self._id(p) for p in bytes(data).decode().split("\x00")]

    def seq_restore(self, seq_id: int, n_keep: int, n_checkpoint: int,
                    state: list[int]) -> int:
        cells = self._seqs.setdefault(seq_id, [])
        if self.window is None or len(cells) - n_keep <= self.window:
            del cells[n_keep:]
            return len(cells)
        assert state == cells[:n_checkpoint], "a checkpoint of other tokens"
        del cells[n_checkpoint:]
        self.restored.append(n_checkpoint)
        return n_checkpoint

    def seq_save(self, seq_id: int, n_tokens: int) -> bytes | None:
        # The cells' pieces: another fake of the same name reads them back as its own ids.
        cells = self._seqs.get(seq_id, [])
        if len(cells) != n_tokens or not n_tokens:
            return None
        self.saved.append(n_tokens)
        return "\x00".join(self._piece(t) for t in cells).encode()

    def seq_load(self, seq_id: int, state: Any, n_tokens: int) -> bool:
        pieces = bytes(state).decode().split("\x00")
        if len(pieces) != n_tokens:
            self._seqs[seq_id] = []
            return False
        self._seqs[seq_id] = [self._id(p) for p in pieces]
        self.loaded.append(n_tokens)
        return True
    def rank_tokens(self, query: str, document: str) -> list[int]:
        return [*self.tokenize(query, add_special=True), self._id("<sep>"),
                *self.tokenize(document, add_special=False)]

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """A bag-of-pieces vector: the mean of one fixed pseudo-random vector per token, so
        that equal texts get equal vectors and texts sharing words point the same way."""
        self.embed_calls.append(len(inputs))
        if self.embed_delay_s and self._interrupt.wait(self.embed_delay_s):
            self.interrupted_calls += 1
            raise StepInterrupted("fake embed: interrupted")
        vectors = []
        for tokens in inputs:
            if not tokens or len(tokens) > self.n_ctx_embed:
                raise LocalInferError(f"fake embed: an input of {len(tokens)} tokens")
            total = [0.0] * self.n_embd
            for token in tokens:
                rng = random.Random(token)
                for i in range(self.n_embd):
                    total[i] += rng.uniform(-1.0, 1.0)
            vectors.append([x / len(tokens) for x in total])
        return vectors

    def warm_up(self) -> None:
        self.warmed_up_on = threading.current_thread().name

    def close(self) -> None:
        self.closed = True
