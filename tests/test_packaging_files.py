"""The service files in packaging/ parse and run `localinfer serve`."""

from __future__ import annotations

import configparser
import plistlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_systemd_user_unit():
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "packaging" / "systemd" / "localinfer.service")
    assert unit["Service"]["ExecStart"].endswith("localinfer serve")
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    assert unit["Install"]["WantedBy"] == "default.target"


def test_launchd_agent():
    with open(ROOT / "packaging" / "launchd" / "dev.localinfer.serve.plist", "rb") as f:
        agent = plistlib.load(f)
    assert agent["Label"] == "dev.localinfer.serve"
    assert agent["ProgramArguments"][1:] == ["serve"]
    assert agent["ProgramArguments"][0].endswith("/localinfer")
    assert agent["RunAtLoad"] is True
