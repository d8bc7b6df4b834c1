"""What this machine offers: RAM, CPU, GPUs, the llama.cpp build's backends and the measured
host memory bandwidth, as one frozen ``HardwareProfile``.

Probing is I/O at the edge (``probe()``); everything downstream (the planner) takes the
profile as data, so tests and ``localinfer plan --hardware FILE`` use recorded profiles.

    profile.py      HardwareProfile (CPU, GPUs, RPC workers, bandwidth) and its JSON file format
    probe.py        the probes: RAM, CPU and ISA flags, GPUs, the build's backends, put together
    bandwidth.py    host memory read bandwidth, measured with numpy and cached per machine
    load.py         how busy the machine was over a measurement (other processes' CPU time)
    rpc.py          a pure-Python ggml-rpc client: a worker checked before llama.cpp connects
"""

from .probe import probe
from .profile import CPUInfo, GPUInfo, HardwareProfile, load_profile

__all__ = ["CPUInfo", "GPUInfo", "HardwareProfile", "load_profile", "probe"]
