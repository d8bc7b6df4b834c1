"""Turning a stream of token bytes into text: UTF-8 reassembly and stop strings."""

from __future__ import annotations

import codecs


class TextAssembler:
    """Collects token bytes into text and holds back what might be the start of a stop string.

    ``push`` returns the text that is safe to show now. When a stop string appears, everything
    from it on is dropped and ``stopped`` becomes True.
    """

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._longest_stop = max((len(s) for s in stop), default=0)
        self._pending = ""  # decoded text not yet released (could begin a stop string)
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release()

    def flush(self) -> str:
        """Release what is held back at the end of generation (no stop string came)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        out, self._pending = self._pending, ""
        self.text += out
        return out

    def _release(self) -> str:
        if not self._stop:
            out, self._pending = self._pending, ""
            self.text += out
            return out
        # The stop string may straddle released text and the pending text: search from
        # just far enough back into what was released.
        window_start = max(0, len(self.text) - self._longest_stop + 1)
        joined = self.text[window_start:] + self._pending
        first = -1
        for s in self._stop:
            i = joined.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            cut = window_start + first  # index in the full text where the stop string begins
            already = len(self.text)
            if cut < already:  # cannot happen: we never release a possible stop prefix
                cut = already
            out = (self.text + self._pending)[already:cut]
            self.text += out
            self._pending = ""
            self.stopped = True
            return out
        hold = _longest_stop_prefix_suffix(joined, self._stop)
        keep = len(self._pending) - hold if hold <= len(self._pending) else 0
        out = self._pending[:keep]
        self._pending = self._pending[keep:]
        self.text += out
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
