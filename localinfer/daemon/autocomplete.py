"""What makes a fill-in-the-middle request an autocomplete request, on every route that takes
one (``/infill``, ``/v1/completions`` and ``/api/generate`` with a ``suffix``): it runs at
interactive priority (someone is typing), and the next keystroke's request from the same client
cancels it if it is still running.

"The same client" is the same peer address asking the same model about text that starts the
same way: the first ``KEY_CHARS`` characters of the lines before the cursor's line (editors send
the file, or a window of lines, from a fixed start, and typing changes the cursor's line). Two
editors on one machine share an address, so each still gets its own completions as long as
their files differ.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request

from ..runtime.types import Priority, SamplingParams
from .requests import asked_priority, parse_priority

KEY_CHARS = 256
"""How much of the text before the cursor's line, and of the text after the cursor, tells one
file's requests from another's: typing at the cursor changes neither."""


def supersede_key(request: Request, model: str, context: str, after: str = "") -> str:
    """The key under which a newer request from this client replaces an older one: the
    client (every local one is 127.0.0.1), the model, the start of the file before the
    cursor's line and the text just after the cursor (two files that begin with the same
    licence header cancelled each other's completions on the start alone)."""
    peer = request.client.host if request.client else "local"
    lines_before = context[:context.rfind("\n") + 1]
    return f"{peer}\0{model}\0{lines_before[:KEY_CHARS]}\0{after[:KEY_CHARS]}"


def autocomplete_params(params: SamplingParams, request: Request, model: str,
                        context: str, after: str = "") -> SamplingParams:
    return dataclasses.replace(params, supersede=supersede_key(request, model, context, after))


def autocomplete_priority(request: Request, body: dict[str, Any]) -> Priority:
    """Interactive unless the client says otherwise (``priority`` or the
    ``X-Localinfer-Priority`` header)."""
    asked = asked_priority(request, body)
    return Priority.INTERACTIVE if asked is None else parse_priority(asked)
