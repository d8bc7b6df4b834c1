"""The local daemon: one loaded model per machine, shared by the chat UI and editor plugins,
served over a Unix socket and loopback TCP in the OpenAI and Ollama wire formats.

    app.py             the HTTP app, its guard (Host/Origin/API key/body size) and errors
    openai_routes.py   /v1/models, /v1/chat/completions, /v1/completions
    ollama_routes.py   /api/version, tags, ps, show, chat, generate
    native_routes.py   /health, /metrics, /localinfer/* (used by localinfer's own client)
    manager.py         loading on demand, swapping, keep-alive unloading
    bridge.py          engine events into the event loop; disconnects cancel generations
    server.py          lifecycle: pid-file lock, sockets, signals, idle exit
    instance.py        finding a running daemon (no web imports, for clients)
"""
