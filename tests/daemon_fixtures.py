"""The ``daemon`` fixture: the daemon with the scripted fake backend, two fake models installed
(fake:1b-f16, other:2b-f16), each answering ``daemon_util.REPLY``. A test module uses it with
``pytest_plugins = ["daemon_fixtures"]``."""

from __future__ import annotations

import pytest

from daemon_util import REPLY, fake_factory, install_fake_models, serve


@pytest.fixture
def daemon(home):
    install_fake_models("fake:1b-f16", "other:2b-f16")
    with serve(fake_factory(reply=REPLY, step_delay_s=0.001)) as d:
        yield d
