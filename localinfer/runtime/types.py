"""The runtime's vocabulary: the loaded model's facts (``ModelInfo``), sampling parameters,
messages, and the events a generation yields.

A generation yields ``Token`` events (a piece of text, with live speed figures) and ends with
one ``Done`` event carrying the usage and the request's timings. These types are plain data so
that the CLI, the daemon and the chat UI can all read them without importing the backend.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Literal

from ..errors import InvalidRequest
from .grammar import Grammar

FinishReason = Literal["stop", "length", "cancelled"]

MAX_STOP_CHARS = 512
"""Longer stop strings would make every token's check slow (and no client needs them)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives reported per token (OpenAI's and Ollama's limit)."""
CHAIN_SAMPLERS = frozenset({"top_k", "top_p", "min_p", "temperature", "penalties", "infill"})
"""The samplers a request may name in its own chain (``SamplingParams.chain``: llama-server's
``samplers``)."""


class Priority(enum.IntEnum):
    """Who is waiting: an interactive chat goes before a burst of editor completions."""

    INTERACTIVE = 0
    NORMAL = 1
    BACKGROUND = 2


KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
"""The KV cache element types a model can load with (llama.cpp's ``type_k``/``type_v``)."""


def kv_cache_types(kv_type: str) -> tuple[str, str]:
    """The K and the V cache types a ``kv_type`` setting names: one type for both
    (``"q8_0"``) or ``"K,V"`` (``"q8_0,q4_0"``, as llama-server's ``-ctk``/``-ctv``).
    ValueError, naming the setting's choices, for anything else."""
    parts = [part.strip() for part in kv_type.split(",")]
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or any(part not in KV_CACHE_TYPES for part in parts):
        raise ValueError(f"unknown KV cache type {kv_type!r}: use one of"
                         f" {', '.join(KV_CACHE_TYPES)} for K and V both, or K,V (e.g."
                         " q8_0,q4_0) for each its own")
    return parts[0], parts[1]


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model that front ends display."""

    name: str
    path: str
    architecture: str
    quant: str
    size_bytes: int
    n_params: int
    n_layers: int
    n_gpu_layers: int
    """Layers actually offloaded to the GPU."""
    n_ctx_train: int
    n_ctx: int
    """Context per slot."""

    n_slots: int
    n_vocab: int
    gpu_backend: str | None = None
    """"CUDA", "Metal", "Vulkan"... or None for a CPU-only build."""
    flash_attn: bool | None = None
    """Whether attention uses flash attention; None when llama.cpp chose (on a GPU)."""
    kv_type: str = "f16"
    """The KV cache's element type (f16, q8_0): what the roofline reads per cached token."""
    base_model: bool = False
    """A base (pretrained, not instruction-tuned) model: it continues text; it does not follow
    instructions or chat."""
    chat_template: str | None = None
    bos_text: str = ""
    eos_text: str = ""
    add_bos: bool = True
    fim: tuple[str, str, str] | None = None
    """Fill-in-the-middle token texts (prefix, suffix, middle) for code models that have them."""
    embedding_only: bool = False
    """An embedding model: it returns vectors and generates no text."""
    reranker: bool = False
    """A reranker (its GGUF's pooling is rank): it scores (query, document) pairs, one number
    each, and generates no text (``embedding_only`` too)."""
    split: tuple[tuple[str, int], ...] = ()
    """Where the layers are when RPC workers hold some: (device, layers) for the local CPU,
    then each worker's device ("HOST:PORT #0"); the output layer counts as one. Empty on one
    machine."""
    buffers: tuple[tuple[str, str, int], ...] = ()
    """The memory llama.cpp allocated, as it reported it while loading: (buffer's device
    ("CPU_Mapped", "Vulkan0", "Vulkan_Host"...), "model", "KV", "compute", "output" or "RS",
    bytes)."""
    n_cpu_moe: int = 0
    """Layers whose expert tensors were kept in RAM (LoadOptions.n_cpu_moe)."""

    @property
    def most_context(self) -> int:
        """The most context a request to this model may have: what it was trained for, or the
        context loaded where larger (a daemon grows the loaded one for a long prompt)."""
        return max(self.n_ctx_train or 0, self.n_ctx)

    @property
    def computes_on_cpu(self) -> bool:
        """Whether layers, or a mixture's experts (``n_cpu_moe``), run on the CPU's cores:
        such models take turns on them (runtime/turns.py) and decode on one thread
        (llama/decode.py's CPU_COMPUTE)."""
        return self.n_gpu_layers < self.n_layers or self.n_cpu_moe > 0

    @property
    def gpu_bytes(self) -> int:
        """What llama.cpp allocated on GPUs (0 when it did not say, or on none)."""
        return sum(size for device, _, size in self.buffers
                   if not (device.startswith("CPU") or device.endswith("_Host")))


@dataclass(frozen=True)
class ReasoningBudget:
    """A cap on a reply's reasoning, as llama-server's reasoning budget: once the reasoning
    block (opened by ``open_tag`` at the reply's start, or by the prompt) has ``tokens``
    tokens, ``close`` is written in the model's place (its tokens forced, one a step), so
    the model goes on with its answer."""

    tokens: int
    open_tag: str
    close: str
    """The text that ends the reasoning (``</think>``, or harmony's move to its final
    channel), forced when the budget is spent."""
    close_tag: str
    """The tag whose writing ends the reasoning (then nothing is forced)."""
    opened: bool = False
    """The prompt opened the block: the reply begins inside it."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. Defaults follow llama.cpp's."""

    max_tokens: int | None = 512
    """Most tokens to generate; None means until the context is full."""
    temperature: float = 0.8
    """0 picks the most likely token (greedy, deterministic)."""
    top_p: float = 0.95
    """Keep the smallest set of tokens whose probabilities add up to this (1 = off)."""
    top_k: int = 40
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.05
    """Drop tokens less likely than min_p times the most likely one (0 = off)."""
    repeat_penalty: float = 1.0
    """Divide the logits of recently seen tokens by this (1 = off)."""
    repeat_last_n: int = 64
    """How many recent tokens the repeat penalty looks at."""
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    """Random seed for sampling; None picks a fresh one per request."""
    stop: tuple[str, ...] = ()
    """Generation ends before any of these strings; they are not included in the text."""
    speculative: bool | None = None
    """Prompt-lookup speculative decoding: None lets the engine decide."""
    typical_p: float = 1.0
    """Locally typical sampling: keep the tokens whose surprise is closest to the expected
    surprise, up to this probability mass (1 = off)."""
    mirostat: int = 0
    """Mirostat sampling (0 = off, 1 = version 1, 2 = version 2): it replaces top-k, top-p,
    min-p and typical-p and steers towards a target surprise."""
    mirostat_tau: float = 5.0
    """Mirostat's target surprise (entropy), in nats."""
    mirostat_eta: float = 0.1
    """Mirostat's learning rate."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling; -inf bans a token."""
    chain: tuple[str, ...] | None = None
    """The samplers that run, in this order (llama-server's ``samplers``, names of
    CHAIN_SAMPLERS): one left out does not run, and ``infill`` (llama.cpp's sampler for
    fill-in-the-middle, which editors ask for) runs only here. The penalties, where it names
    them, run first; a temperature of 0 is greedy and mirostat replaces the chain, as with the
    standard chain.
    None: the standard chain (penalties, top-k, typical-p, top-p, min-p, temperature)."""
    logprobs: int | None = None
    """Report each generated token's log-probability with this many most likely alternatives
    (0: the token's alone); None (the default) computes nothing."""
    t_max_predict_ms: float | None = None
    """Autocomplete's time limit (llama-server's): the generation stops at the first new line
    generated later than this after the first token (a whole line, never a cut one; a line
    that does not end runs on, as in llama-server)."""
    n_indent: int = 0
    """Autocomplete's indentation floor (llama-server's): a new line indented by fewer than
    this many spaces or tabs ends the generation, without that line."""
    supersede: str | None = None
    """Autocomplete's keystroke rule: a later request with the same key (one editor, one
    file) cancels this one if it is still waiting or running; editors send one per keystroke
    and want only the newest."""
    grammar: Grammar | None = None
    """What the reply must look like (JSON of a schema, tool calls); None: anything."""
    cache_prompt: bool = False
    """The client asked for this prompt's prefix to be cached (Anthropic's
    ``cache_control``): it is saved to the prefix cache on disk on its first reading."""
    reasoning_budget: ReasoningBudget | None = None
    """The most tokens the reply's reasoning may take (Anthropic's thinking.budget_tokens);
    None: no cap but max_tokens."""

    def validate(self) -> SamplingParams:
        """Raise InvalidRequest for a value no sampler can use; return self."""
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}.")
        checks = [
            ("temperature", self.temperature, 0.0, 100.0),
            ("top_p", self.top_p, 0.0, 1.0),
            ("min_p", self.min_p, 0.0, 1.0),
            ("repeat_penalty", self.repeat_penalty, 0.0, 100.0),
            ("frequency_penalty", self.frequency_penalty, -100.0, 100.0),
            ("presence_penalty", self.presence_penalty, -100.0, 100.0),
        ]
        for name, value, low, high in checks:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a number, got {value!r}.")
            if not low <= value <= high:
                raise InvalidRequest(f"{name} must be between {low:g} and {high:g}, got {value}.")
        if self.repeat_penalty == 0:
            raise InvalidRequest("repeat_penalty must be above 0 (1 turns it off).")
        if not 0 <= self.top_k < 2**31:
            raise InvalidRequest(f"top_k must be 0 (off) or more, got {self.top_k}.")
        if not -1 <= self.repeat_last_n < 2**31:
            raise InvalidRequest(f"repeat_last_n must be -1 (the whole context), 0 (off) or"
                                 f" more, got {self.repeat_last_n}.")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise InvalidRequest(f"seed must be between 0 and 2^32-1, got {self.seed}.")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings.")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise InvalidRequest(f"stop strings must be at most {MAX_STOP_CHARS} characters.")
        if not 0.0 < self.typical_p <= 1.0:
            raise InvalidRequest(f"typical_p must be above 0 and at most 1, got {self.typical_p}.")
        if self.mirostat not in (0, 1, 2):
            raise InvalidRequest(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}.")
        if not (0.0 < self.mirostat_tau <= 100.0 and 0.0 < self.mirostat_eta <= 1.0):
            raise InvalidRequest("mirostat_tau must be above 0 (at most 100) and mirostat_eta"
                                 " above 0 (at most 1).")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs (logprobs on /v1/completions) must be between"
                                 f" 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}.")
        if self.t_max_predict_ms is not None and not (
                isinstance(self.t_max_predict_ms, (int, float))
                and 0 <= self.t_max_predict_ms < math.inf):
            raise InvalidRequest(f"t_max_predict_ms must be 0 (off) or more milliseconds, got"
                                 f" {self.t_max_predict_ms!r}.")
        if not 0 <= self.n_indent < 1024:
            raise InvalidRequest(f"n_indent must be between 0 (off) and 1023, got"
                                 f" {self.n_indent}.")
        if len(self.stop) > 16:
            raise InvalidRequest(f"at most 16 stop strings, got {len(self.stop)}.")
        unknown = sorted(set(self.chain or ()) - CHAIN_SAMPLERS)
        if unknown:
            raise InvalidRequest(f"sampler {unknown[0]!r} is not supported (use"
                                 f" {', '.join(sorted(CHAIN_SAMPLERS))}).")
        if "infill" in (self.chain or ()) and self.grammar is not None:
            # It may end the reply with a token the grammar does not allow there.
            raise InvalidRequest("the infill sampler cannot run with a grammar or JSON schema:"
                                 " leave 'infill' out of 'samplers', or the grammar out.")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """A repetition penalty is on (and, in a request's own chain, named there): the sampler
        needs the recent tokens (the prompt's too), and it may reorder the logits."""
        return bool(self.repeat_last_n and (self.repeat_penalty != 1.0
                                            or self.frequency_penalty or self.presence_penalty)
                    and (self.chain is None or "penalties" in self.chain))

    def bounded(self, n_ctx: int, n_vocab: int) -> SamplingParams:
        """The same parameters with the model's limits applied: repeat_last_n -1 means the
        whole context, and neither window reaches past what the model has."""
        for token, _ in self.logit_bias:
            if n_vocab and not 0 <= token < n_vocab:
                raise InvalidRequest(f"logit_bias: token {token} is not in the model's"
                                     f" vocabulary (0 to {n_vocab - 1}).")
        last_n = n_ctx if self.repeat_last_n < 0 else min(self.repeat_last_n, n_ctx)
        top_k = min(self.top_k, n_vocab) if n_vocab else self.top_k
        if (last_n, top_k) == (self.repeat_last_n, self.top_k):
            return self
        return dataclasses.replace(self, repeat_last_n=last_n, top_k=top_k)


DEFAULT_SAMPLING = SamplingParams()
"""The parameters a call without any uses (one frozen instance, shared as a default)."""


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made (parsed from its reply, or sent back in the
    history)."""

    name: str
    arguments: str
    """The arguments as JSON text (an object)."""
    id: str = ""


@dataclass(frozen=True)
class Message:
    role: str
    """"system", "user", "assistant" (or "tool")."""
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant message's calls."""
    tool_call_id: str = ""
    """A tool message's answer to this call (OpenAI)."""
    tool_name: str = ""
    """A tool message's function (Ollama's ``tool_name``)."""


@dataclass(frozen=True)
class LiveStats:
    """Speed so far, sent with every token."""

    n_tokens: int
    """Tokens generated so far."""
    ttft_ms: float
    prefill_tps: float
    decode_tps: float
    """Tokens per second since the first token (0 until the second token)."""
    prompt_tokens: int = 0
    """The prompt's tokens (llama-server's ``tokens_evaluated``)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Prompt tokens whose KV cache was reused from an earlier request (not evaluated again)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Where one request's time went. All durations in milliseconds."""

    load_ms: float = 0.0
    """Time spent loading the model for this request (0 when it was already loaded)."""
    prepare_ms: float = 0.0
    """From the request's arrival to its submission: parsing it, the chat template,
    tokenizing (0 where the front end does not say when it arrived). Not part of ttft_ms."""
    queue_ms: float = 0.0
    """Time waiting for a free slot."""
    setup_ms: float = 0.0
    """From admission to the first decode that reads its prompt: the sampler, the cache's
    reuse and trim, the step other sequences were in. Part of prefill_ms."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    restored_tokens: int = 0
    """Of the cached tokens, those read back from the prefix cache on disk."""
    prefill_tokens: int = 0
    """Prompt tokens actually evaluated (prompt_tokens - cached_tokens)."""
    prefill_ms: float = 0.0
    """From the start of prompt evaluation to the first token."""
    ttft_ms: float = 0.0
    """From submission to the first token (queue + prefill)."""
    completion_tokens: int = 0
    decode_tokens: int = 0
    """Tokens generated after the first one: the ones the decode rate is measured over."""
    decode_ms: float = 0.0
    """From the first token to the last."""
    total_ms: float = 0.0
    drafted_tokens: int = 0
    """Speculative tokens proposed (prompt lookup)."""
    accepted_tokens: int = 0
    """Speculative tokens the model agreed with."""

    @property
    def prefill_tps(self) -> float:
        return _rate(self.prefill_tokens, self.prefill_ms)

    @property
    def decode_tps(self) -> float:
        return _rate(self.decode_tokens, self.decode_ms)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token and its log-probability under the model (with the most likely
    alternatives at its position, when asked for)."""

    text: str
    """The token's text (a partial UTF-8 character shows as U+FFFD; ``data`` has the bytes)."""
    data: bytes
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Token:
    """A piece of generated text (may hold several tokens' worth, or part of a character)."""

    text: str
    live: LiveStats
    logprobs: tuple[TokenLogprob, ...] = ()
    """The tokens this piece completes, when the request asked for log-probabilities."""


@dataclass(frozen=True)
class Done:
    """The last event of a generation."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings = field(default_factory=Timings)
    logprobs: tuple[TokenLogprob, ...] = ()
    """Every generated token's log-probability, when the request asked for them."""
    stop_sequence: str = ""
    """The request's stop string that ended the reply (finish_reason "stop"), if one did."""


Event = Token | Done


@dataclass(frozen=True)
class Ranking:
    """A reranker's score of each document for one query, in the documents' order."""

    scores: list[float]
    prompt_tokens: int
    """Tokens read, all pairs together."""
    total_ms: float


@dataclass(frozen=True)
class Embeddings:
    """The vectors for a list of inputs, in their order: the model's pooled output as it is
    (callers that want unit vectors normalise them; see ``normalized``)."""

    vectors: list[list[float]]
    prompt_tokens: int
    """Tokens read, all inputs together."""
    total_ms: float
    """From submission to the last vector."""


def normalized(vector: list[float], dimensions: int | None = None) -> list[float]:
    """``vector`` cut to its first ``dimensions`` values (Matryoshka models are trained for
    that) and scaled to length 1, as Ollama and llama-server return embeddings. A zero vector
    stays zero."""
    cut = vector[:dimensions] if dimensions else vector
    norm = math.sqrt(math.fsum(x * x for x in cut))
    return [x / norm for x in cut] if norm > 0 else list(cut)


def _rate(tokens: int, ms: float) -> float:
    return tokens * 1000.0 / ms if ms > 0 else 0.0


@dataclass(frozen=True)
class EngineStats:
    """An engine's counters, for /metrics and the status bar (``Engine.stats``)."""

    requests_total: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generated_tokens_total: int
    queue_depth: int
    active: int
    n_slots: int
    last_decode_tps: float
    drafted_tokens_total: int = 0
    accepted_tokens_total: int = 0
    preemptions_total: int = 0
    read_ahead_tokens_total: int = 0
    interrupted_steps_total: int = 0
    """Decodes stopped part way: every request in them cancelled, or a long prompt chunk
    yielding to a more urgent request."""
    """Tokens of next turns' openings read while idle (checkpoints.READ_AHEAD_IDLE_S)."""
