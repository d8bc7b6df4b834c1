"""The prefix cache on disk on the real starter model, through the daemon: a long prompt served,
the daemon stopped, a new one started, the same request again reads only the tail (the usage
says so: its cached tokens came from disk, and the prompt tokens read are the last few)."""

from __future__ import annotations

import contextlib

import anthropic
import pytest

from daemon_util import openai_client, serve
from localinfer.config import Config
from localinfer.loading import engine_factory, prefix_store
from localinfer.paths import get_paths
from localinfer.runtime.checkpoints import REREAD_TAIL
from localinfer.runtime.disk_cache import PrefixStore

pytestmark = pytest.mark.model

MODEL = "gemma3:270m"
CONFIG = Config(ctx=4096, prefix_cache_gb=1.0, prefix_cache_min_tokens=512)
# ~2,100 tokens of a system prompt, then a short question.
SYSTEM = "\n".join(f"Rule {i}: answer file number {i} with the value {i * 7 % 13}."
                   for i in range(120))


@pytest.fixture
def empty_cache(starter_path):
    store = PrefixStore(get_paths().prefix_cache_dir, 0)
    store.clear()
    yield store
    store.clear()


@contextlib.contextmanager
def daemon():
    with serve(engine_factory(CONFIG, n_slots=1)) as d:
        d.daemon.state.prefix_cache = prefix_store(CONFIG)  # as `serve` hands it over
        yield d


def status(d) -> dict:
    with d.uds() as http:
        return http.get("/localinfer/status").json()["prefix_cache"]


def test_a_prompt_read_twice_is_restored_after_a_restart(empty_cache):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What is the value of file 3?"}]

    def ask(d):
        return openai_client(d).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0)

    with daemon() as d:
        cold = ask(d)
        n = cold.usage.prompt_tokens
        assert n > 1500 and cold.usage.prompt_tokens_details.cached_tokens == 0
        warm = ask(d)  # read before: its prefix is saved
        assert warm.usage.prompt_tokens_details.cached_tokens == n - REREAD_TAIL
        empty_cache.flush()
    (entry,) = empty_cache.entries()
    assert entry.n_tokens == n - REREAD_TAIL
    # Saved after the first token (the starter's window layers cannot be cut back): the
    # whole prompt, with the window's checkpoint where the prefix ends.
    header = empty_cache.header(entry)
    assert header["full_tokens"] == n and header["window_bytes"] > 0
    with daemon() as d:  # a new daemon: nothing in memory
        again = ask(d)
        assert again.usage.prompt_tokens == n
        assert again.usage.prompt_tokens_details.cached_tokens == n - REREAD_TAIL
        assert again.choices[0].message.content == cold.choices[0].message.content
        cache = status(d)
        assert cache["hits"] == 1 and cache["restored_tokens"] == n - REREAD_TAIL
        assert cache["entries"] == 1 and cache["bytes"] > 0


def test_cache_control_saves_at_the_first_reading(empty_cache):
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "What is the value of file 5?"}]

    def ask(d):
        client = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0,
                                     timeout=600)
        return client.messages.create(model=MODEL, system=system, messages=messages,
                                      max_tokens=8, extra_body={"temperature": 0})

    with daemon() as d:
        cold = ask(d)
        n = cold.usage.input_tokens
        assert cold.usage.cache_read_input_tokens == 0
        empty_cache.flush()
    with daemon() as d:
        again = ask(d)
        # The prefill read only the tail: the rest came back from disk.
        assert again.usage.input_tokens == REREAD_TAIL
        assert again.usage.cache_read_input_tokens == n - REREAD_TAIL
        assert again.content[0].text == cold.content[0].text
