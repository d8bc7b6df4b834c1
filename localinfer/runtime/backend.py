"""The contract between the engine and a model backend (llama.cpp, or the fake one in tests).

A backend is deliberately low-level: tokenize, decode a batch of (token, position, sequence)
entries, sample with a per-sequence native sampler, and trim a sequence's KV cache. Everything
above that (scheduling, batching, prefix reuse, speculation, stop strings, timings) lives in the
engine, so the fake backend exercises the same engine code as llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .grammar import Grammar
from .types import ModelInfo, SamplingParams

ProgressCallback = Callable[[float], None]
"""Called with the fraction done (0..1) while a model loads."""


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model. Zero/None values mean "let llama.cpp or the plan decide"."""

    n_ctx: int = 4096
    """Context window of each sequence (slot), in tokens."""
    n_slots: int = 1
    """Sequences decoded in parallel; the KV cache holds n_slots x n_ctx tokens."""
    n_gpu_layers: int = 0
    """Layers offloaded to the GPU (-1 = all)."""
    n_threads: int = 0
    """CPU threads for decode (0 = physical cores)."""
    n_threads_batch: int = 0
    """CPU threads for prompt processing (0 = same as n_threads)."""
    adapt_threads: bool = False
    """Use fewer threads than n_threads while that is measured faster (other processes
    taking cores; see runtime/threads.py), else exactly n_threads."""
    n_batch: int = 512
    """Most tokens submitted to one decode call (prefill is chunked to this)."""
    n_ubatch: int = 512
    """Rows llama.cpp computes in one step (its physical batch, at most n_batch; it sizes the
    compute buffer), as the plan counts memory (planner.physical_batch)."""
    measured_ubatch: int = 0
    """The physical batch this machine measured fastest for this model on the CPU
    (planner.attention), which the planner's rule then does not replace; 0: the rule's."""
    cpu_window_ubatch: int = 0
    """The physical batch instead of n_ubatch where the load turns out CPU-only (no GPU
    layer, no RPC worker, no flash attention: known only as the model loads), for a model
    whose window attention weighs (planner.shrinks_window_cache); its chats then keep
    checkpoints (Backend.cut_reach). 0: n_ubatch, and no checkpoints of chats."""
    flash_attn: bool | None = None
    """None: off on the CPU, llama.cpp's choice on a GPU (see runtime.llama.flash_attn_type)."""
    use_mmap: bool = True
    kv_type: str = "f16"
    """KV cache element type: "f16", "q8_0" (half the memory) or "q4_0" (a quarter) for K and
    V, or "K,V" for each its own (runtime.types.kv_cache_types); quantized needs flash
    attention."""
    chat_template: str | None = None
    """Jinja template used when the GGUF has none."""
    base_model: bool = False
    """The catalog lists the model as a base model (pretrained, not instruction-tuned): it
    continues text and does not follow instructions or chat."""
    embedding_only: bool = False
    """The catalog lists the model as an embedding model (the GGUF header may say so too)."""
    fim_spm: bool = False
    """The family was trained with fill-in-the-middle prompts in suffix-prefix-middle order."""
    lora_adapters: tuple[str, ...] = ()
    """LoRA adapter GGUFs (a preset's ADAPTER lines) applied at scale 1 to every context."""
    rpc_servers: tuple[str, ...] = ()
    """RPC workers ("HOST:PORT", each probed by hardware.rpc first) whose devices take the
    ``n_gpu_layers`` offloaded layers; the local CPU keeps the rest."""
    tensor_split: tuple[float, ...] = ()
    """With rpc_servers: each worker device's share of the offloaded layers, in the order
    the workers are listed (empty: by their free memory)."""
    local_gpu: bool = False
    """With rpc_servers: this machine's first GPU takes layers too, after the workers'
    devices (its share is tensor_split's last)."""
    n_cpu_moe: int = 0
    """A mixture-of-experts model: keep the expert tensors of its first n_cpu_moe layers in
    RAM, whatever device their layer is on (llama.cpp's tensor buffer-type overrides, as
    llama-server's ``--n-cpu-moe``); attention, the shared tensors and the KV cache stay with
    their layer."""


class Backend(Protocol):
    """A loaded model the engine drives from its single worker thread."""

    info: ModelInfo
    n_batch: int
    fim_repo: tuple[str, str] | None
    """The repo-level FIM token texts (``<|repo_name|>``, ``<|file_sep|>``), if the model
    has them."""
    fim_spm: bool
    """FIM prompts go suffix first (see fim.py)."""
    n_ctx_embed: int
    """The most tokens one input to ``embed`` may have."""
    needs_checkpoints: bool
    """Some of the cache cannot be cut back far (sliding-window layers keep only their
    window): an edit in the middle of a prompt keeps its cache only through a checkpoint
    (``seq_checkpoint``/``seq_restore``)."""
    cut_reach: int
    """Where the engine keeps checkpoints of chats too: how many tokens back from its newest
    a sequence can always be cut (the window cache's cells past the window); 0 where it keeps
    none for chats (see planner.shrinks_window_cache)."""
    tokenizes_here: bool
    """``tokenize`` answers from this process at once, beside a running step (False where it
    goes to the process holding the model, behind the step: runtime/isolated.py)."""
    adaptive_threads: int
    """The most CPU threads a step may use when the engine adapts the count to the load
    (``set_threads``); 0 when the count is fixed."""

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        """Text to tokens; special-token text (``<start_of_turn>``) becomes special tokens."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character)."""
        ...

    max_special_bytes: int
    """The longest special token's text, in bytes."""

    def max_token_bytes(self) -> int:
        """At least as many bytes as any one token spells (0: not known). Read from the
        vocabulary on the first call (a scan of it: 0.23 s for the starter's 262k tokens)."""
        ...

    def special_piece(self, token: int) -> bytes | None:
        """A special token's text as a prompt writes it (``<start_of_turn>``): the tokenizer
        reads such text whole, before the rest. None for an ordinary token."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, end-of-turn)."""
        ...

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """The threads the next one-row steps and the next steps of several rows use, the
        decodes that embed included."""
        ...

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[int],
        outputs: Sequence[bool],
    ) -> None:
        """Evaluate one batch; entries with ``outputs[i]`` can then be sampled at index i."""
        ...

    def interrupt(self) -> None:
        """Ask the decode in flight to stop at llama.cpp's next check (between two nodes of its
        graph): it then raises ``StepInterrupted``, the cache holding what it finished. Safe
        from any thread, and when no decode runs: it stays asked until ``clear_interrupt``.
        A backend that cannot stop a decode lets it finish."""
        ...

    def clear_interrupt(self) -> None:
        """Let the next decode run to its end (the engine calls it before each step)."""
        ...

    def seq_length(self, seq_id: int) -> int:
        """How many positions of sequence ``seq_id`` the KV cache holds (its largest + 1; 0
        when it holds none): after an interrupted decode, how far its prompt was read."""
        ...

    def new_sampler(self, params: SamplingParams, seed: int) -> Any:
        """A native sampler chain for one sequence (constrained by ``params.grammar``)."""
        ...

    def check_grammar(self, grammar: Grammar) -> None:
        """Raise InvalidRequest for a grammar this backend cannot sample with (called when
        a request is submitted, so that it fails before it is queued)."""
        ...

    def sample(self, sampler: Any, index: int) -> int:
        """Sample (and accept) the next token from the logits of batch entry ``index``."""
        ...

    def logits(self, index: int) -> Sequence[float]:
        """A copy of batch entry ``index``'s score for every vocabulary token (for checks
        that ask how close two candidate tokens were, not for sampling)."""
        ...

    def raw_logits(self, index: int) -> np.ndarray:
        """Batch entry ``index``'s logits as llama.cpp computed them, as a view (no copy)
        valid until the next decode or sample: the source of log-probabilities."""
        ...

    def accept(self, sampler: Any, tokens: Sequence[int]) -> None:
        """Feed tokens (the prompt) to the sampler's repetition history."""
        ...

    def force(self, sampler: Any, token: int) -> None:
        """Take ``token`` as the sequence's next, written in the model's place (the end of
        a spent reasoning budget): the sampler (its grammar, its penalties) moves on as if
        it had sampled it. InvalidRequest when the grammar does not allow it here."""
        ...

    def free_sampler(self, sampler: Any) -> None: ...

    def seq_trim(self, seq_id: int, n_keep: int) -> int:
        """Drop sequence ``seq_id``'s KV cells at positions >= n_keep and return how many
        tokens are still usable: ``n_keep``, or 0 when the cache cannot be cut there (a
        sliding-window cache that no longer holds the window before ``n_keep``)."""
        ...

    def can_cut(self, n_cached: int, n_keep: int) -> bool:
        """Whether ``seq_trim`` would keep ``n_keep`` tokens of a sequence holding
        ``n_cached``, from the lengths alone (the slot choice asks it of every free slot; the
        cut itself says for sure)."""
        ...

    def seq_checkpoint(self, seq_id: int, reuse: Any = None) -> Any:
        """The state of the parts of ``seq_id``'s cache that cannot be cut back (its
        sliding-window layers), for ``seq_restore`` to return to this many tokens later.
        ``reuse``: a state an earlier call returned that the caller has dropped; its memory
        may hold this one (memory never touched before faults in page by page: 15-28 ms for
        the starter's 7.5 MiB in a VM, against 0.6-1.6 ms for the copy itself)."""
        ...

    def seq_restore(self, seq_id: int, n_keep: int, n_checkpoint: int, state: Any) -> int:
        """Like ``seq_trim(seq_id, n_keep)``; where the cache cannot be cut there, cut it at
        ``n_checkpoint`` (<= n_keep) and put back the parts saved then by ``seq_checkpoint``
        (``state``, taken when the sequence held the same first ``n_checkpoint`` tokens).
        Returns how many tokens are usable: ``n_keep``, ``n_checkpoint``, or 0."""
        ...

    def checkpoint_data(self, state: Any) -> Any:
        """A copy of a checkpoint ``seq_checkpoint`` returned, as a buffer of bytes, for the
        prefix cache on disk (``disk_cache.Saved.window``)."""
        ...

    def checkpoint_state(self, data: Any) -> Any:
        """A checkpoint for ``seq_restore`` from the bytes ``checkpoint_data`` gave."""
        ...

    def seq_swap(self, a: int, b: int) -> bool:
        """Trade the caches of sequences ``a`` and ``b`` (either may be empty): each then
        holds what the other held, at the same positions. False when one could not be put
        back; both are then empty. A ``LocalInferError`` leaves both as they were."""
        ...

    state_format: str
    """What a sequence's state from ``seq_save`` is valid for besides the model file (the
    build, the load options that shape the KV cache), for the prefix cache on disk; "" where
    this backend saves none."""

    def seq_save(self, seq_id: int, n_tokens: int) -> Any:
        """The whole state of sequence ``seq_id``'s cache, which holds exactly its first
        ``n_tokens`` positions, as a buffer of bytes for ``seq_load`` into this model loaded
        the same way (``state_format``), here or in a later process; None where it cannot."""
        ...

    def seq_load(self, seq_id: int, state: Any, n_tokens: int) -> bool:
        """Empty ``seq_id``'s cache and put back a state ``seq_save`` returned for
        ``n_tokens`` positions: True when it then holds them; False (it is empty) where
        the state does not fit this model or context."""
        ...

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """The pooled, unnormalised vector of each input (at most ``n_ctx_embed`` tokens
        each), several inputs per decode; a reranker's is its score (one number)."""
        ...

    def rank_tokens(self, query: str, document: str) -> list[int]:
        """A (query, document) pair as a reranker reads it (llama-server's layout: BOS,
        query, EOS, SEP, document, EOS, as the vocabulary asks for each)."""
        ...

    def warm_up(self) -> None:
        """Run one throwaway decode (called once, on the engine's worker thread)."""
        ...

    def close(self) -> None: ...


def window_can_cut(n_swa: int, cut_reach: int, n_cached: int, n_keep: int) -> bool:
    """``Backend.can_cut`` for llama.cpp's cache: a sliding-window layer (``n_swa`` > 0) keeps
    every cell of a sequence no longer than its window, and ``cut_reach`` cells more than the
    window of a longer one."""
    return not n_swa or n_cached <= n_swa or n_cached - n_keep <= cut_reach
