"""The ``daemon`` fixture: the daemon with the scripted fake backend, two fake models installed
(fake:1b-f16, other:2b-f16), each answering ``daemon_util.REPLY``; ``qwen3``: a fake Qwen3
(template_fixtures.QWEN3_TOOLS) that reasons, then calls get_weather for Paris. A test module
uses them with ``pytest_plugins = ["daemon_fixtures"]``."""

from __future__ import annotations

import pytest

from daemon_util import REPLY, fake_factory, install_fake_models, serve
from template_fixtures import QWEN3_CALL, QWEN3_REASONING, QWEN3_TOOLS


@pytest.fixture
def daemon(home):
    install_fake_models("fake:1b-f16", "other:2b-f16")
    with serve(fake_factory(reply=REPLY, step_delay_s=0.001)) as d:
        yield d


@pytest.fixture
def qwen3(home):
    install_fake_models("qwen3:1b-f16")
    with serve(fake_factory(reply=f"<think>\n{QWEN3_REASONING}\n</think>\n\n{QWEN3_CALL}",
                            chat_template=QWEN3_TOOLS)) as d:
        yield d
