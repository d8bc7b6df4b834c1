"""The README's set-up commands stay true: CI runs exactly the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = setup_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    # The test command runs the check script, which ends with the test suite.
    assert commands[1].endswith(".ci/check")
    check = (ROOT / ".ci" / "check").read_text(encoding="utf-8")
    assert check.rstrip().splitlines()[-1].startswith('"$bin/pytest"')


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert setup_commands()[1] in ci.splitlines()
