"""The local daemon: one loaded model per machine, shared by the chat UI and editor plugins,
served over a Unix socket and loopback TCP in the OpenAI and Ollama wire formats.

    app.py             assembles the HTTP app: the routes behind the guard
    guard.py           Host/Origin/API key/body-size checks in front of every route
    errors.py          error bodies in each API's shape; ``guarded`` wraps every route
    state.py           settings, /metrics counters, the state the routes share
    openai_routes.py   /v1/models, /v1/chat/completions, /v1/completions
    ollama_routes.py   /api/version, tags, ps, show, chat, generate, pull, delete
    native_routes.py   /health, /metrics, /localinfer/* (in ../protocol.py's wire format)
    requests.py        reading request bodies: typed fields, errors naming the field
    fields.py          each route's honoured, ignored and refused fields (the README's table)
    thinking.py        think / reasoning_effort to the template; reasoning split from answer
    logprobs.py        log-probabilities in each API's shape
    bridge.py          generations and pulls into the event loop; disconnects cancel them
    manager.py         loading on demand, swapping, keep-alive unloading
    server.py          lifecycle: pid-file lock, sockets, signals, idle exit
    instance.py        finding a running daemon (no web imports, for clients)

Route modules only translate between a wire format and the engine: they import state, errors,
requests, bridge and the protocol, never each other or app.py.
"""
