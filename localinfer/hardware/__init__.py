"""What this machine offers: RAM, CPU, GPUs, the llama.cpp build's backends and the measured
host memory bandwidth, as one frozen ``HardwareProfile``.

Probing is I/O at the edge (``probe()``); everything downstream (the planner) takes the
profile as data, so tests and ``localinfer plan --hardware FILE`` use recorded profiles.
"""

from .probe import probe
from .profile import CPUInfo, GPUInfo, HardwareProfile, load_profile

__all__ = ["CPUInfo", "GPUInfo", "HardwareProfile", "load_profile", "probe"]
