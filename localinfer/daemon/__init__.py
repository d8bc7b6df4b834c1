"""The local daemon: one loaded model per machine, shared by the chat UI and editor plugins,
served over a Unix socket and loopback TCP in the OpenAI, Anthropic and Ollama wire formats.

    http_app.py          assembles the HTTP app: the routes behind the guard
    guard.py             Host/Origin/API key/body-size checks in front of every route
    error_replies.py     error bodies in each API's shape; ``guarded`` wraps every route
    state.py             settings, /metrics counters, the state the routes share
    openai_routes.py     /v1/models, /v1/chat/completions, /v1/completions
    anthropic_routes.py  /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API)
    responses_routes.py  /v1/responses (OpenAI's Responses API, Codex's): create, get, delete
    response_store.py    stored responses on disk, for previous_response_id, GET and DELETE
    ollama_routes.py     /api/version, tags, ps, show, chat, generate, pull, delete
    native_routes.py     /health, /metrics, /localinfer/* (in ../protocol.py's wire format)
    llama_routes.py      llama-server's /infill for editor autocomplete plugins
    llama_fields.py      llama-server's n_predict, samplers, default model; on /infill and /v1
    embedding_routes.py  /api/embed, /api/embeddings, /v1/embeddings; /v1/rerank, /rerank
    preset_routes.py     /api/create (presets, quantizing), /api/copy; /api/push refused
    autocomplete.py      a FIM request's interactive priority; the next keystroke cancels it
    requests.py          reading request bodies: typed fields, errors naming the field
    fields.py            each route's honoured, ignored and refused fields (docs/api.md's table)
    structured.py        tools and structured output to a grammar; replies to each API's tool_calls
    reasoning_fields.py  think / reasoning_effort to the template; reasoning split from answer
    replies.py           a chat reply's reasoning, content and tool calls, streamed or whole
    logprob_fields.py    log-probabilities in each API's shape
    bridge.py            generations and pulls into the event loop; disconnects cancel them
    manager.py           loading on demand, side by side, eviction, keep-alive unloading
    residency.py         each model's footprint and the machine's budget (the planner's)
    server.py            lifecycle: pid-file lock (../instance.py), sockets, signals, idle exit

Route modules only translate between a wire format and the engine: they import state,
error_replies, requests, bridge and the protocol, never each other or http_app.py.
"""
