"""localinfer: a local LLM inference runtime for consumer hardware.

It picks the model size and quantization that fits the machine, runs it with llama.cpp, and
shows how fast it goes and why, in a terminal chat and through an OpenAI/Ollama-compatible
daemon that editor plugins can use.

The map, front ends first; each layer imports only the ones below it (``pyproject.toml``'s
import contracts hold this, and ``tests/test_layering.py`` checks it at run time):

    cli/            the ``localinfer`` command: one module per command area
    tui/            the terminal chat (Textual): renders and forwards, works through a session
    daemon/         the HTTP daemon (Starlette + uvicorn): routes translate wire formats
    rpc_worker.py   ``localinfer worker``: llama.cpp's RPC server lending this machine's devices
    bench/          ``localinfer bench`` and the editor workload: measured speed
    session.py      the one way a front end reaches a model: the daemon or an in-process engine
    client.py       the one client of the daemon (HTTP on its socket)
    instance.py     finding this user's daemon: its pid file (locked while it runs) and socket
    protocol.py     the types and JSON that cross the process boundary
    chats.py        chat history on disk, written atomically
    loading.py      the composition root: a model file, the plan and the settings into an engine
    selection.py    which model to pick or pull: the planner's preferences from the settings
    sampling_defaults.py  a model's default sampling: its card's, its file's, config.toml's
    store/          installed models, pulls with resume and checksum, the starter
    planner/        plan(hardware, candidates, prefs) -> Plan, and its calibration
    hardware/       probes -> HardwareProfile; measured bandwidth; RPC workers' descriptions
    runtime/        the engine (batching, KV reuse, speculation) over llama.cpp or a fake
    catalog.py      models.toml as typed specs
    gguf.py         bounds-checked GGUF header reading
    config.py       settings from config.toml and the environment
    paths.py        where files live (LOCALINFER_HOME overrides)
    errors.py       the exception tree every user-facing error belongs to
    progress.py     a one-line terminal progress display
    __main__.py     ``python -m localinfer``

Importing the package loads nothing else: a client or ``--help`` pays only for what it uses.
"""

__version__ = "0.1.0"
