"""The runtime: the one engine that both front ends (the daemon and the chat UI) go through.

``Engine`` (engine.py) owns a loaded model and schedules every request on it; ``Backend``
(backend.py) is the contract it drives, implemented by llama.cpp (llama.py, the only module
that imports ``llama_cpp``) and by a scripted fake for tests (fake.py).
"""

from .backend import Backend, LoadOptions, ModelInfo
from .engine import Engine, EngineStats, Generation
from .types import Done, LiveStats, Message, Priority, SamplingParams, Timings, Token, Usage

__all__ = [
    "Backend", "Done", "Engine", "EngineStats", "Generation", "LiveStats", "LoadOptions",
    "Message", "ModelInfo", "Priority", "SamplingParams", "Timings", "Token", "Usage",
]
