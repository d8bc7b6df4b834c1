"""Turning a stream of token bytes into text: UTF-8 reassembly and stop strings."""

from __future__ import annotations

import codecs


class TextAssembler:
    """Collects token bytes into text and holds back what might be the start of a stop string.

    ``push`` returns the text that is safe to show now. When a stop string appears, everything
    from it on is dropped and ``stopped`` becomes True. With ``min_indent`` (autocomplete's
    n_indent), a line after the first is held back until its indentation is known, and one
    indented by fewer spaces or tabs stops the text before it (blank lines pass).
    """

    def __init__(self, stop: tuple[str, ...] = (), *, min_indent: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._longest_stop = max((len(s) for s in stop), default=0)
        self._pending = ""  # decoded text not yet released (could begin a stop string)
        self.text = ""  # everything released so far
        self.stopped = False
        self.stop_string = ""
        """The stop string that ended the text, once one has."""
        self._min_indent = min_indent
        self._line_head = ""  # a new line's leading whitespace, held back (min_indent only)
        self._in_head = False
        self.indent_stopped = False
        """The text stopped at a line indented less than ``min_indent`` (a limit, as
        llama-server reports it, not a stop string)."""

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._indented(self._release())

    def flush(self) -> str:
        """Release what is held back at the end of generation (no more text will come)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        out = self._indented(self._release(final=True))
        if self._in_head and not self.stopped:  # whitespace at the very end: let it go
            out, self._line_head = out + self._line_head, ""
        return out

    def _indented(self, released: str) -> str:
        """The part of ``released`` (already added to ``text``) that may be shown, holding
        back a new line's indentation until its first other character decides it."""
        if not self._min_indent or not released:
            return released
        out = []
        rest = released
        while rest:
            if self._in_head:
                body = rest.lstrip(" \t")
                self._line_head += rest[:len(rest) - len(body)]
                if not body:
                    break
                if body[0] != "\n" and len(self._line_head) < self._min_indent:
                    # This line ends the completion: its text (and all after) goes, its
                    # leading whitespace stays, as llama-server cuts it.
                    self.text = self.text[:len(self.text) - len(body)]
                    out.append(self._line_head)
                    self._pending, self._line_head, self.stopped = "", "", True
                    self.indent_stopped = True
                    break
                out.append(self._line_head)
                self._line_head, self._in_head, rest = "", False, body
            newline = rest.find("\n")
            if newline < 0:
                out.append(rest)
                break
            out.append(rest[:newline + 1])
            rest, self._in_head = rest[newline + 1:], True
        return "".join(out)

    def _release(self, final: bool = False) -> str:
        if not self._stop:
            out, self._pending = self._pending, ""
            self.text += out
            return out
        # A stop string may straddle released text and pending text: look back just far
        # enough into what was released (which never holds the start of a stop string).
        window_start = max(0, len(self.text) - self._longest_stop + 1)
        joined = self.text[window_start:] + self._pending
        released = len(self.text) - window_start  # where the pending text begins in joined
        found = [i for i in (joined.find(s) for s in self._stop) if i != -1]
        first = min(found) if found else None
        # Text from ``hold`` on could still turn out to begin a stop string.
        hold = len(joined) if final else len(joined) - _longest_stop_prefix_suffix(
            joined, self._stop)
        if first is not None and first <= hold:
            # The earliest stop string, and no longer one starting before it may still come.
            out = joined[released:max(first, released)]
            self.text += out
            self._pending = ""
            self.stopped = True
            self.stop_string = next(s for s in self._stop if joined.find(s) == first)
            return out
        hold = max(hold, released)
        out = joined[released:hold]
        self.text += out
        self._pending = joined[hold:]
        return out


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
