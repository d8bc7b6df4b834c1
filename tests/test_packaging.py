"""The wheel: models.toml ships inside it, and the console script is declared."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_wheel_contains_the_catalog_and_the_console_script(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True)
    [wheel] = tmp_path.glob("localinfer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "localinfer/models.toml" in names
        assert "localinfer/runtime/llama/__init__.py" in names
        assert z.read("localinfer/models.toml") == (ROOT / "models.toml").read_bytes()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "localinfer = localinfer.cli:main" in z.read(entry_points).decode()
