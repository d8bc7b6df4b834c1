"""The runtime: the one engine that both front ends (the daemon and the chat UI) go through.

``Engine`` (engine.py) owns a loaded model and schedules every request on it; ``Backend``
(backend.py) is the contract it drives, implemented by llama.cpp (llama/, the only package
that imports ``llama_cpp``) and by a scripted fake for tests (fake.py). It runs what it is
handed (loading.py, above it, plans the load): it imports no planner, store or probe.

    engine.py         the batch loop and its admission: one worker thread per model
    generation.py     a request as its caller holds it (Generation) and the engine tracks it
    slots.py          the KV cache's slots and their checkpoints; which prompts a step reads
    checkpoints.py    which slot a request takes, what its cache reuses and keeps for the next
    prompts.py        chats, completions, infills, embedding inputs to tokens
    prompt_cache.py   tokenizing a prompt that starts like a recent one: only the new part
    disk_cache.py     the prefix cache on disk: long prefixes' KV state, kept across restarts
    chat_template.py  rendering a conversation with the model's Jinja template
    fim.py            fill-in-the-middle prompts, as llama-server's /infill builds them
    speculate.py      prompt-lookup drafts, and which drafts and sequences a step takes
    threads.py        thread counts that follow the machine's load
    turns.py          the engines of a process take turns on the CPU cores; indexing waits
    text.py           token bytes to text: UTF-8 reassembly and stop strings
    logprobs.py       log-probabilities from the raw logits
    grammar.py        what a reply must look like (JSON schema, GBNF) for llama.cpp's sampler
    shortlist.py      the few tokens a grammar is asked about, for exact sampling
    workload.py       what a model was asked to do here, counted for its next load's set-up
    tools.py          tool-call formats: their grammar, parsing calls back out
    thinking.py       thinking templates: switching them, splitting reasoning from the answer
    types.py          the vocabulary: ModelInfo, sampling parameters, messages, events, stats
    backend.py        the Backend contract and LoadOptions
    inflight.py       how many model loads are inside llama.cpp now (what Ctrl-C's exit asks)
    llama/            the llama.cpp backend (the only package that imports llama_cpp)
    isolated.py       the llama.cpp backend in a child process, for models with RPC workers
    fake.py           a scripted backend for tests

The names below load on first use (PEP 562), so importing ``runtime.types`` alone, as the
daemon's client does through the protocol module, loads neither the engine (its scheduler,
speculation, chat templates) nor jinja2: about 40 modules, a third of the client's import time.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "Backend": "backend", "LoadOptions": "backend",
    "Engine": "engine", "EngineStats": "types", "Generation": "engine",
    "Done": "types", "LiveStats": "types", "Message": "types", "ModelInfo": "types",
    "Priority": "types", "SamplingParams": "types", "Timings": "types", "Token": "types",
    "Usage": "types",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:  # a submodule not imported yet (runtime.llama) is found after this
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
