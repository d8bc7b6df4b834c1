"""localinfer's own client of the daemon: engine events streamed back, cancelling with the
daemon's own figures, loading with progress, and the daemon's errors raised as the same class."""

from __future__ import annotations

import pytest

from daemon_util import REPLY, fake_factory, install_fake_models, serve
from localinfer.client import DaemonClient
from localinfer.errors import ContextOverflow, ModelNotFound
from localinfer.runtime.types import Done, Message, SamplingParams, Token

pytest_plugins = ["daemon_fixtures"]  # daemon


def test_client_streams_engine_events(daemon):
    client = DaemonClient.discover()
    assert client is not None and client.socket_path == daemon.socket
    generation = client.generate("fake:1b", messages=[Message("user", "hi")],
                                 params=SamplingParams(temperature=0))
    events = list(generation)
    assert isinstance(events[-1], Done) and events[-1].text == REPLY
    assert all(isinstance(e, Token) for e in events[:-1])
    assert events[-2].live.n_tokens > 1
    assert generation.info.name == "fake:1b-f16"
    assert events[-1].timings.completion_tokens == events[-1].usage.completion_tokens


def test_client_cancel_and_errors(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005, n_ctx=512)) as d:
        client = DaemonClient(socket_path=d.socket)
        generation = client.generate("fake:1b", prompt="x")
        for event in generation:
            if isinstance(event, Token) and event.live.n_tokens >= 3:
                generation.cancel()
        assert generation.done.finish_reason == "cancelled"
        with pytest.raises(ModelNotFound):
            client.generate("missing:1b", prompt="x")
        with pytest.raises(ContextOverflow, match="512 tokens"):
            client.generate("fake:1b", prompt="word " * 600)


def test_client_load_reports_progress_and_describes_the_model(home):
    install_fake_models("fake:1b-f16")
    seen = []
    with serve(fake_factory()) as d:
        client = DaemonClient(socket_path=d.socket)
        info = client.load("fake:1b", progress=seen.append)
        assert info.name == "fake:1b-f16" and info.n_ctx == 2048
        assert seen[-1] == 1.0
        assert list(d.manager.loaded) == ["fake:1b-f16"]


def test_client_cancel_ends_with_the_daemons_own_figures(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        client = DaemonClient(socket_path=d.socket)
        generation = client.generate("fake:1b", prompt="count with me")
        for event in generation:
            if isinstance(event, Token) and event.live.n_tokens >= 5:
                assert generation.prompt_tokens == 6  # bos + "count", " ", "with", " ", "me"
                generation.cancel()
        done = generation.done
        assert done.finish_reason == "cancelled"
        assert done.usage.prompt_tokens == 6 and done.usage.completion_tokens >= 5
        assert done.timings.decode_tps > 0 and done.timings.ttft_ms > 0
        assert d.manager.loaded["fake:1b-f16"].engine.stats().active == 0


def test_the_client_rebuilds_the_daemons_error_class(home):
    from localinfer.errors import ModelLoadError

    install_fake_models("fake:1b-f16")

    def broken(model, num_ctx, progress=None):
        raise ModelLoadError("llama.cpp could not load it (out of memory?)")

    with serve(broken) as d:
        client = DaemonClient(socket_path=d.socket)
        with pytest.raises(ModelLoadError, match="out of memory"):
            client.generate("fake:1b", prompt="x")


@pytest.mark.parametrize("address,url", [
    ("localhost", "http://localhost:11480"), ("[::1]", "http://[::1]:11480"),
    ("http://[::1]", "http://[::1]:11480"), ("[::1]:8080", "http://[::1]:8080"),
    ("https://box.lan:443", "https://box.lan:443"), ("h:11500", "http://h:11500")])
def test_localinfer_host_forms(address, url):
    assert DaemonClient.for_address(address).url == url


@pytest.mark.parametrize("address", ["h:abc", "h:0", "h:99999", "[::1", "unix:", "ftp://h:1"])
def test_localinfer_host_mistakes_are_config_errors(address):
    from localinfer.errors import ConfigError

    with pytest.raises(ConfigError, match="LOCALINFER_HOST"):
        DaemonClient.for_address(address)
