"""Measuring localinfer on this machine: the benchmarks and workload harnesses behind
``localinfer bench`` and the scripts in the repository's ``bench/``. A front end: it loads the
engine (or starts servers), so nothing in the core imports it.

    engine_bench.py      ``localinfer bench``: prefill, decode, batching, prefix reuse,
                         speculation and structured output through the engine; calibration
    editor_workload.py   ``bench --editor``: a chat, FIM keystrokes and embeddings at once
                         over HTTP, and the servers and workers it starts and stops
    prefill_bench.py     ``bench --prefill``: prompt reading at agent lengths, flash attention
                         off and on, two physical batch sizes
"""
