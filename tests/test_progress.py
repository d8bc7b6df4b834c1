"""The terminal progress line."""

from __future__ import annotations

import io


def test_the_line_fits_the_terminal():
    """A line wider than the terminal wraps, and every redraw leaves a line behind (a
    50-column terminal showed a trail of ~100-character lines)."""
    from localinfer.progress import TerminalProgress

    bar = TerminalProgress("Pulling hf.co/someone/a-long-repository-name-GGUF:q4_k_m",
                           total=253e6, stream=io.StringIO())
    bar.update(104e6)
    now = bar.start + 2.0
    wide = bar.line(now, 200)
    assert "ETA" in wide and "MB/s" in wide
    for columns in (120, 79, 50, 30, 12):
        line = bar.line(now, columns)
        assert len(line) <= columns, (columns, line)
    assert "41.1%" in bar.line(now, 79)
