"""The runtime: the one engine that both front ends (the daemon and the chat UI) go through.

``Engine`` (engine.py) owns a loaded model and schedules every request on it; ``Backend``
(backend.py) is the contract it drives, implemented by llama.cpp (llama.py, the only module
that imports ``llama_cpp``) and by a scripted fake for tests (fake.py).

The names below load on first use (PEP 562), so importing ``runtime.types`` alone, as the
daemon's client does through the protocol module, loads neither the engine (its scheduler,
speculation, chat templates) nor jinja2: about 40 modules, a third of the client's import time.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "Backend": "backend", "LoadOptions": "backend",
    "Engine": "engine", "EngineStats": "engine", "Generation": "engine",
    "Done": "types", "LiveStats": "types", "Message": "types", "Priority": "types",
    "SamplingParams": "types", "Timings": "types", "Token": "types", "Usage": "types",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:  # a submodule not imported yet (runtime.llama) is found after this
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
