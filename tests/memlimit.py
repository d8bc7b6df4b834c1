"""A cap on this process's address space for a while, to make a load run out of memory for
real and safely: past the cap, mmap and malloc fail with ENOMEM and nothing is killed."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def address_space_limit(room: int) -> Iterator[None]:
    """Let this process's address space grow by at most ``room`` bytes, then lift the cap.
    llama.cpp's CPU buffers are malloc'd, and so is the device memory of Mesa's llvmpipe (the
    GPU lane's Vulkan device), whose vkAllocateMemory then fails with
    VK_ERROR_OUT_OF_DEVICE_MEMORY as a GPU's does at the end of its memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + room, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
