"""A coding agent's prompt on the real starter with the daemon's default settings: the
context is planned for agents (the starter was trained for 32k, and 32k x its slots fits this
machine), so a ~20k-token request on /v1/chat/completions is served, with no num_ctx (an
OpenAI client cannot send one) and no config."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from daemon_util import serve
from localinfer.config import load_config
from localinfer.daemon.residency import MemoryPlan
from localinfer.loading import engine_factory

pytestmark = pytest.mark.model

SOURCES = Path(__file__).resolve().parent.parent / "localinfer"


def repository_prompt(n_chars: int) -> str:
    """A Cline-shaped system prompt: instructions, then the repository's files, cut at
    ``n_chars``."""
    parts = ["You are a coding agent. The repository's files follow; answer questions about"
             " them briefly.\n"]
    size = len(parts[0])
    for path in sorted(SOURCES.rglob("*.py")):
        text = f"\n<file path='{path.relative_to(SOURCES.parent)}'>\n{path.read_text()}</file>\n"
        if size + len(text) > n_chars:
            parts.append(text[:n_chars - size])
            break
        parts.append(text)
        size += len(text)
    return "".join(parts)


def test_a_20k_token_agent_prompt_is_served_with_the_default_settings(home, starter_path):
    config = load_config()  # a fresh home: no config.toml, no ctx, no slots
    assert config.ctx is None and config.slots is None and not config.models
    with serve(engine_factory(config), memory=MemoryPlan.for_machine(config),
               max_loaded=None) as d:
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0,
                               timeout=600)
        started = time.perf_counter()
        out = client.chat.completions.create(
            model="gemma3:270m", max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": repository_prompt(70_000)},
                      {"role": "user", "content": "Which module loads a model file?"}])
        seconds = time.perf_counter() - started
        entry = d.manager.loaded["gemma3:270m-q4_k_m"]
        info = entry.engine.info
        print(f"\n{out.usage.prompt_tokens} prompt tokens served in {seconds:.1f} s (the load"
              f" {entry.load_ms / 1000:.1f} s of it); loaded with {info.n_ctx} x"
              f" {info.n_slots} slots")
    assert 18_000 <= out.usage.prompt_tokens <= 24_000
    assert out.usage.completion_tokens >= 1 and out.choices[0].finish_reason in ("stop",
                                                                                 "length")
    # The plan's context (the trained 32768, which fits here): no reload was needed.
    assert info.n_ctx == info.n_ctx_train == 32768
