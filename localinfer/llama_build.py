"""The one seam through which the hardware probe asks the llama.cpp build for its devices
without importing the runtime (hardware/ sits below runtime/): a front end installs a loader
of runtime/llama/ggml_devices.py (``install``, as ``localinfer``'s command line does), and
the probe calls ``load()``. With none installed, ``load`` raises ImportError, and the probe
says so and assumes a CPU-only build."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing only: this module is imported by every command line, so stays bare
    from collections.abc import Callable, Sequence
    from typing import Protocol

    class BuildDevice(Protocol):
        """A device llama.cpp can use (runtime.llama.Device)."""

        @property
        def name(self) -> str: ...
        @property
        def kind(self) -> str: ...
        @property
        def description(self) -> str: ...
        @property
        def backend(self) -> str: ...
        @property
        def memory_free(self) -> int: ...
        @property
        def memory_total(self) -> int: ...

    class LlamaBuild(Protocol):
        """What the probe asks the build (runtime/llama/ggml_devices.py answers)."""

        def devices(self) -> Sequence[BuildDevice]: ...
        def supports_gpu_offload(self) -> bool: ...

_loader: Callable[[], LlamaBuild] | None = None


def install(loader: Callable[[], LlamaBuild]) -> None:
    """Use ``loader`` to reach the build: it imports llama-cpp-python when called (ImportError
    or OSError where it cannot be loaded)."""
    global _loader
    _loader = loader


def load() -> LlamaBuild:
    """The build's device listing, through the installed loader."""
    if _loader is None:
        raise ImportError("no llama.cpp build was installed for the probe"
                          " (localinfer.llama_build.install)")
    return _loader()
