"""Every request field of the generation and embedding routes, and what the daemon does with
it: honoured,
accepted and ignored (where OpenAI, Anthropic or Ollama tolerate it too, and ignoring it changes
no reply),
or refused with a 400 that names it. A field in none of the lists is refused as unknown.

The routes audit each body against these lists before reading it, and docs/api.md's table of
request fields is generated from them (``fields_table``; tests/test_fields.py checks that the
two agree), so the documentation and the code cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest


@dataclass(frozen=True)
class Refused:
    """A field the daemon does not implement: a 400 with ``message``, unless its value asks
    for nothing (``allows``: the default value clients send, e.g. ``n: 1``)."""

    message: str
    allows: Callable[[Any], bool] = lambda value: False
    allowed: str = ""
    """The values let through, for docs/api.md (e.g. "1", "false")."""


@dataclass(frozen=True)
class RouteFields:
    """The fields one route (or the ``options`` object of Ollama's routes) knows."""

    honoured: tuple[str, ...]
    elsewhere: tuple[str, ...] = ()
    """Honoured by the tool-calling, structured-output and fill-in-the-middle code."""
    ignored: dict[str, str] = field(default_factory=dict)
    """Accepted and ignored, with the reason ignoring it changes nothing."""
    refused: dict[str, Refused] = field(default_factory=dict)

    def audit(self, body: dict[str, Any], *, route: str, where: str = "") -> None:
        """Raise InvalidRequest for the first refused or unknown field of ``body``, or an
        ignored one of the wrong type (OpenAI's ``user`` as a number is a client's mistake,
        not something to let through because nothing reads it)."""
        known = set(self.honoured) | set(self.elsewhere) | set(self.ignored)
        for name, value in body.items():
            if value is None:
                continue
            if name in self.ignored and name in IGNORED_KINDS:
                kinds, what = IGNORED_KINDS[name]
                if not isinstance(value, kinds) or (
                        isinstance(value, bool) and bool not in kinds):
                    raise InvalidRequest(f"'{where}{name}' must be {what}.")
            if name in known:
                continue
            rule = self.refused.get(name)
            if rule is None:
                raise InvalidRequest(f"'{where}{name}' is not a field of {route} that localinfer"
                                     " implements; remove it (docs/api.md lists the fields).")
            if not rule.allows(value):
                raise InvalidRequest(f"'{where}{name}': {rule.message}")


_STRING = ((str,), "a string")
_BOOLEAN = ((bool,), "true or false")
_INTEGER = ((int,), "an integer")
_OBJECT = ((dict,), "an object")

IGNORED_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    **dict.fromkeys(("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                     "service_tier", "inference_geo", "user_profile_id", "workspace_id"),
                    _STRING),
    **dict.fromkeys(("store", "cache_prompt", "low_vram", "numa", "use_mmap", "use_mlock"),
                    _BOOLEAN),
    **dict.fromkeys(("num_thread", "num_batch", "num_gpu", "main_gpu", "num_keep", "id_slot",
                     "t_max_prompt_ms", "max_tool_calls"), _INTEGER),
    **dict.fromkeys(("metadata", "prompt_cache_options", "stream_options", "client_metadata"),
                    _OBJECT),
    "response_fields": ((list,), "a list of field names"),
    "annotations": ((list,), "a list"),
}
"""The JSON type each accepted-and-ignored field has where it is defined (OpenAI's,
Anthropic's, Ollama's and llama-server's references); a field of another type is a 400."""


def _false(value: Any) -> bool:
    return value is False


def _one(value: Any) -> bool:
    return value == 1 and not isinstance(value, bool)


def _empty(value: Any) -> bool:
    return value in ("", [], {})


_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty",
             "repeat_last_n", "frequency_penalty", "presence_penalty", "seed", "stop",
             "mirostat", "mirostat_tau", "mirostat_eta", "logit_bias", "speculative")
"""What ``requests.sampling`` reads (OpenAI's names and llama-server's extensions)."""

_LOCALINFER = ("priority",)

_OPENAI_IGNORED = {
    "user": "an end user's id for abuse monitoring; nothing is monitored locally",
    "store": "nothing is stored",
    "metadata": "kept with stored completions; nothing is stored",
    "safety_identifier": "an end user's id for abuse monitoring; nothing is monitored locally",
    "prompt_cache_key": "prompt caching is automatic: each request reuses the longest"
                        " cached prefix",
    "prompt_cache_retention": "prompt caching is automatic: cached prefixes stay while memory"
                              " holds them",
    "prompt_cache_options": "prompt caching is automatic: each request reuses the longest"
                            " cached prefix",
    "cache_prompt": "llama-server's switch; prompt caching is always on",
    "service_tier": "there is one tier",
}

_OPENAI_REFUSED = {
    "functions": Refused("the deprecated function-calling fields are not supported; send"
                         " 'tools'."),
    "function_call": Refused("the deprecated function-calling fields are not supported;"
                             " send 'tool_choice'."),
    "audio": Refused("this model server makes no audio; leave it out."),
    "modalities": Refused("text is the only output modality.",
                          lambda v: v == ["text"], '["text"]'),
    "prediction": Refused("predicted outputs are not supported; localinfer drafts from the"
                          " prompt by itself (prompt-lookup speculation)."),
    "web_search_options": Refused("there is no web search (localinfer runs offline)."),
    "verbosity": Refused("not supported; ask for brevity in the prompt."),
    "moderation": Refused("no moderation model runs here."),
}

_ID_SLOT = ("the engine puts a prompt in the slot whose cache holds most of it (an editor's:"
            " the slot its last request used)")

_LLAMA_SERVER = ("n_predict", "samplers")
"""llama-server's own fields that it reads on its OpenAI routes too (llama_fields.py)."""

_LLAMA_SERVER_IGNORED = {
    "id_slot": _ID_SLOT,
    "response_fields": "llama-server reads it here and applies it only to /infill and"
                       " /completion replies: the reply keeps OpenAI's shape",
}

V1_CHAT = RouteFields(
    honoured=("model", "messages", "stream", "stream_options", "n", "max_tokens",
              "max_completion_tokens", "logprobs", "top_logprobs", "reasoning_effort",
              "chat_template_kwargs", *_SAMPLING, *_LLAMA_SERVER, *_LOCALINFER),
    elsewhere=("tools", "tool_choice", "parallel_tool_calls", "response_format", "grammar",
               "json_schema"),
    ignored={**_OPENAI_IGNORED, **_LLAMA_SERVER_IGNORED},
    refused=_OPENAI_REFUSED,
)

V1_COMPLETIONS = RouteFields(
    honoured=("model", "prompt", "stream", "stream_options", "n", "max_tokens", "logprobs",
              *_SAMPLING, *_LLAMA_SERVER, *_LOCALINFER),
    elsewhere=("suffix", "response_format", "grammar", "json_schema"),
    ignored={**_OPENAI_IGNORED, **_LLAMA_SERVER_IGNORED},
    refused={
        "best_of": Refused("one candidate per request; send best_of: 1 or leave it out.",
                           _one, "1"),
        "echo": Refused("echoing the prompt is not supported; the client has it.", _false,
                        "false"),
    },
)

V1_RESPONSES = RouteFields(
    honoured=("model", "input", "instructions", "stream", "store", "previous_response_id",
              "metadata", "max_output_tokens", "top_logprobs", "reasoning", "include",
              *_SAMPLING, *_LOCALINFER),
    elsewhere=("tools", "tool_choice", "parallel_tool_calls", "text"),
    ignored={
        "user": _OPENAI_IGNORED["user"],
        "safety_identifier": _OPENAI_IGNORED["safety_identifier"],
        "prompt_cache_key": _OPENAI_IGNORED["prompt_cache_key"],
        "prompt_cache_retention": _OPENAI_IGNORED["prompt_cache_retention"],
        "prompt_cache_options": _OPENAI_IGNORED["prompt_cache_options"],
        "service_tier": _OPENAI_IGNORED["service_tier"],
        "max_tool_calls": "caps calls to OpenAI's built-in tools; none runs here",
        "stream_options": "its include_obfuscation pads stream events against network side"
                          " channels; localinfer's stream stays on this machine",
        "client_metadata": "the client's labels for the request (Codex's turn metadata) for"
                           " OpenAI's logs; nothing is logged",
    },
    refused={
        "truncation": Refused("localinfer never drops input items: a conversation longer"
                              " than the context is a 400 (send \"disabled\").",
                              lambda v: v == "disabled", '"disabled"'),
        "background": Refused("background responses are not supported; stream instead (send"
                              " false or leave it out).", _false, "false"),
        "background_options": Refused("background responses are not supported."),
        "conversation": Refused("the Conversations API is not implemented; continue a"
                                " conversation with 'previous_response_id'."),
        "prompt": Refused("stored prompt templates live on OpenAI's servers; send"
                          " 'instructions' and 'input'."),
        "context_management": Refused("server-side compaction is not supported; a"
                                      " conversation longer than the context is a 400."),
        "moderation": _OPENAI_REFUSED["moderation"],
        "image": Refused("this model server makes no images."),
        "access_programs": Refused("OpenAI's access programs do not apply to a local model."),
    },
)

V1_RESPONSES_INPUT_TOKENS = RouteFields(
    honoured=("model", "input", "instructions", "previous_response_id", "reasoning"),
    elsewhere=("tools", "tool_choice", "parallel_tool_calls", "text"),
    refused={
        "truncation": V1_RESPONSES.refused["truncation"],
        "conversation": V1_RESPONSES.refused["conversation"],
        "personality": Refused("OpenAI's style presets belong to its models; write the style"
                               " into 'instructions'."),
    },
)

_OLLAMA_HONOURED = ("model", "stream", "options", "keep_alive", "think", "logprobs",
                    "top_logprobs", *_LOCALINFER)
_OLLAMA_REFUSED = {
    "truncate": Refused("localinfer never cuts a prompt that overflows the context; it answers"
                        " 400 (send false, or leave it out).", _false, "false"),
    "shift": Refused("localinfer does not shift the context when a reply fills it; the reply"
                     " ends with done_reason \"length\" (send false, or leave it out).",
                     _false, "false"),
}

API_CHAT = RouteFields(
    # temperature, top_p, max_output_tokens: where options leaves them out (the AI SDK's
    # Ollama provider, Cline's, sends them at the top; ollama_routes.TOP_LEVEL_SAMPLING).
    honoured=("messages", *_OLLAMA_HONOURED, "temperature", "top_p", "max_output_tokens"),
    elsewhere=("tools", "tool_choice", "format"),
    refused=_OLLAMA_REFUSED,
)

API_GENERATE = RouteFields(
    honoured=("prompt", "system", "raw", *_OLLAMA_HONOURED),
    elsewhere=("suffix", "format"),
    refused={
        **_OLLAMA_REFUSED,
        "images": Refused("this model server has no vision support.", _empty, "empty"),
        "template": Refused("a Go template is not supported; send 'raw': true with a fully"
                            " formatted prompt instead.", _empty, "empty"),
        "context": Refused("the deprecated token context is not supported; send the"
                           " conversation as messages to /api/chat.", _empty, "empty"),
        **{name: Refused("image generation is not supported.") for name in
           ("width", "height", "steps")},
    },
)

_PLACEMENT = "the daemon's plan places every model for all its clients (see `localinfer plan`)"

API_OPTIONS = RouteFields(
    honoured=("num_ctx", "num_predict", *_SAMPLING),
    ignored={
        "num_thread": "threads are the daemon's (`--threads`, measured per machine); they"
                      " change the speed, not the reply",
        "num_batch": _PLACEMENT,
        "num_gpu": _PLACEMENT,
        "main_gpu": _PLACEMENT,
        "low_vram": _PLACEMENT,
        "numa": _PLACEMENT,
        "use_mmap": _PLACEMENT,
        "use_mlock": _PLACEMENT,
        "num_keep": "tokens kept when the context shifts; localinfer never shifts it",
    },
    refused={
        "tfs_z": Refused("tail-free sampling was removed from llama.cpp (1 turns it off).",
                         lambda v: v == 1, "1"),
        "penalize_newline": Refused("was removed from llama.cpp.", _false, "false"),
        "f16_kv": Refused("the KV cache type is the daemon's (--kv-type).",
                          lambda v: v is True, "true"),
        **{name: Refused("is not supported.", _false, "false") for name in
           ("logits_all", "vocab_only", "embedding_only")},
    },
)

INFILL = RouteFields(
    honoured=("model", "input_prefix", "input_suffix", "input_extra", "prompt",
              *_LLAMA_SERVER, "max_tokens", "t_max_predict_ms", "n_indent", "stream",
              "response_fields", "n_cmpl", "n", *_SAMPLING, *_LOCALINFER),
    elsewhere=("grammar", "json_schema"),
    ignored={"t_max_prompt_ms": "llama-server reads it and does not enforce it either",
             "id_slot": _ID_SLOT},
    refused={
        "cache_prompt": Refused("false is not supported: the KV cache of an earlier request"
                                " with the same start is always reused.",
                                lambda v: v is True, "true"),
        "n_probs": Refused("token probabilities are not returned by /infill; send 0 or leave"
                           " it out (/v1/completions returns them with 'logprobs').",
                           lambda v: v == 0 and not isinstance(v, bool), "0"),
        "return_tokens": Refused("token ids are not returned; send false or leave it out.",
                                 _false, "false"),
    },
)

COMPLETION = RouteFields(
    honoured=("model", "prompt", *_LLAMA_SERVER, "max_tokens", "t_max_predict_ms", "n_indent",
              "stream", "response_fields", "n_cmpl", "n", *_SAMPLING, *_LOCALINFER),
    elsewhere=("grammar", "json_schema"),
    ignored={"t_max_prompt_ms": INFILL.ignored["t_max_prompt_ms"], "id_slot": _ID_SLOT},
    refused={**INFILL.refused, "n_probs": Refused(
        "token probabilities are not returned by /completion; send 0 or leave it out"
        " (/v1/completions returns them with 'logprobs').",
        lambda v: v == 0 and not isinstance(v, bool), "0")},
)

TOKENIZE = RouteFields(
    honoured=("model", "content", "add_special", "with_pieces"),
    refused={"parse_special": Refused("special-token text (<start_of_turn>) is always read"
                                      " as special tokens; send true or leave it out.",
                                      lambda v: v is True, "true")},
)

DETOKENIZE = RouteFields(honoured=("model", "tokens"))

_PAST_THINKING = ("an earlier turn's thinking: chat templates leave it out of the prompt, as"
                  " localinfer does")

CHAT_MESSAGE = RouteFields(
    # name: given to the chat template as llama-server does (a tool result's function name;
    # most templates leave it out for other roles).
    honoured=("role", "content", "tool_calls", "tool_call_id", "name", "tool_name"),
    ignored={"reasoning_content": _PAST_THINKING, "reasoning": _PAST_THINKING,
             "thinking": _PAST_THINKING, "reasoning_details": _PAST_THINKING,
             "thinking_blocks": _PAST_THINKING,
             "annotations": "citations of OpenAI's web search, which does not run here",
             "cache_control": "prompt caching is automatic: each request reuses the longest"
                              " cached prefix"},
    refused={
        "images": Refused("this model server has no vision support; send text only.", _empty,
                          "empty"),
        "audio": Refused("this model server has no audio support; send text only."),
        "refusal": Refused("an assistant's refusal is text: put it in 'content'.", _empty,
                           "empty"),
        "function_call": Refused("the deprecated function-calling fields are not supported;"
                                 " send 'tool_calls'."),
        "prefix": Refused("continuing a partial assistant message (prefix) is not supported;"
                          " send the text as a completion prompt (/v1/completions).",
                          _false, "false"),
    },
)
"""The fields of one message in ``messages`` (Chat Completions, Ollama's /api/chat,
llama-server's routes)."""

_RENDERED = ("model", "messages", "reasoning_effort", "chat_template_kwargs")
APPLY_TEMPLATE = RouteFields(
    honoured=_RENDERED,
    elsewhere=("tools", "tool_choice", "parallel_tool_calls"),
    ignored={**{name: "the prompt is rendered, nothing is generated" for name in
                V1_CHAT.honoured + V1_CHAT.elsewhere
                if name not in _RENDERED + ("tools", "tool_choice", "parallel_tool_calls")},
             **V1_CHAT.ignored},
    refused=V1_CHAT.refused,
)

API_EMBED = RouteFields(
    honoured=("model", "input", "truncate", "dimensions", "options", "keep_alive"))

API_EMBEDDINGS = RouteFields(honoured=("model", "prompt", "options", "keep_alive"))

V1_EMBEDDINGS = RouteFields(
    honoured=("model", "input", "encoding_format", "dimensions"),
    ignored={"user": _OPENAI_IGNORED["user"]})

EMBED_OPTIONS = RouteFields(
    honoured=("num_ctx",),
    ignored={**{name: why for name, why in API_OPTIONS.ignored.items() if name != "num_keep"},
             # A client that sends one options object to every route (as Ollama ignores it).
             **dict.fromkeys(("num_predict", *_SAMPLING), "an embedding samples nothing")})

_ANTHROPIC_IGNORED = {
    "cache_control": "counting reads no cache; on /v1/messages it (or one on any block)"
                     " saves the prompt's prefixes to the prefix cache on disk at once",
    "speed": "there is one speed, the machine's",
    "inference_geo": "inference runs on this machine",
    "user_profile_id": "an Anthropic account's setting; there is one local user",
    "workspace_id": "an Anthropic account's setting; there is one local user",
}

_ANTHROPIC_REFUSED = {
    "container": Refused("code-execution containers are Anthropic's server tools; localinfer"
                         " has none."),
    "mcp_servers": Refused("the MCP connector calls remote servers from Anthropic's side;"
                           " connect MCP servers in the client instead."),
    "context_management": Refused("server-side context editing is not supported (Claude Code"
                                  " leaves it out with CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1)."
                                  , _empty, "empty"),
    "diagnostics": Refused("Anthropic's service diagnostics are not supported."),
}

V1_MESSAGES = RouteFields(
    honoured=("model", "max_tokens", "messages", "system", "stream", "stop_sequences",
              "temperature", "top_p", "top_k", "thinking", "cache_control", *_LOCALINFER),
    elsewhere=("tools", "tool_choice", "output_config", "output_format"),
    ignored={
        "metadata": "its user_id is for abuse monitoring; nothing is monitored locally",
        "service_tier": "there is one tier",
        "billing_policy": "nothing is billed locally",
        "fallback_credit_token": "nothing is billed locally",
        **{name: why for name, why in _ANTHROPIC_IGNORED.items() if name != "cache_control"},
    },
    refused={
        **_ANTHROPIC_REFUSED,
        "fallbacks": Refused("fallback models are not supported: the request's model answers"
                             " or the request fails.", _empty, "empty"),
        "compaction": Refused("server-side compaction is not supported; the client compacts"
                              " its history."),
        "thread": Refused("server-side threads are not supported; send the whole history."),
    },
)

V1_COUNT_TOKENS = RouteFields(
    honoured=("model", "messages", "system", "thinking"),
    elsewhere=("tools", "tool_choice", "output_config", "output_format"),
    ignored={name: why for name, why in _ANTHROPIC_IGNORED.items() if name != "inference_geo"},
    refused={name: rule for name, rule in _ANTHROPIC_REFUSED.items()
             if name in ("mcp_servers", "context_management")},
)

API_SHOW = RouteFields(honoured=("model", "name", "verbose"))
API_PULL = RouteFields(
    honoured=("model", "name", "stream"),
    ignored={"insecure": "Ollama's for a registry without TLS; the Hub's HTTPS is always"
                         " checked"})
API_DELETE = RouteFields(honoured=("model", "name"))

API_CREATE = RouteFields(
    honoured=("model", "name", "from", "files", "system", "template", "parameters", "messages",
              "license", "quantize", "stream", "modelfile"),
    refused={
        "adapters": Refused("adapters over the API are blobs pushed to /api/blobs, which"
                            " localinfer does not take; name the adapter's file in a"
                            " Modelfile's ADAPTER line and run `localinfer create`.", _empty,
                            "empty"),
        "renderer": Refused("localinfer renders chats with the model's Jinja chat template;"
                            " give 'template' instead.", _empty, "empty"),
        "parser": Refused("localinfer reads tool calls and thinking with the model's own"
                          " format; there is no parser to choose.", _empty, "empty"),
        "requires": Refused("localinfer checks no Ollama version.", _empty, "empty"),
        "path": Refused("paths are not accepted over the API; use `localinfer create -f"
                        " Modelfile` on this machine."),
    },
)

RERANK = RouteFields(
    honoured=("model", "query", "documents", "top_n", "return_documents"),
    ignored={"user": "an end user's id for abuse monitoring; nothing is monitored locally"},
    refused={"rank_fields": Refused("documents must be strings."),
             "texts": Refused("TEI's rerank format is not served; send 'documents'."),
             "return_text": Refused("TEI's rerank format is not served; use"
                                    " 'return_documents'.")},
)

ROUTES: dict[str, RouteFields] = {
    "/v1/chat/completions": V1_CHAT,
    "/v1/completions": V1_COMPLETIONS,
    "/v1/messages": V1_MESSAGES,
    "/v1/messages/count_tokens": V1_COUNT_TOKENS,
    "/v1/responses": V1_RESPONSES,
    "/v1/responses/input_tokens": V1_RESPONSES_INPUT_TOKENS,
    "/api/chat": API_CHAT,
    "/api/generate": API_GENERATE,
    "/api/chat and /api/generate: options": API_OPTIONS,
    "/infill": INFILL,
    "/completion": COMPLETION,
    "/tokenize": TOKENIZE,
    "/detokenize": DETOKENIZE,
    "/apply-template": APPLY_TEMPLATE,
    "/v1/embeddings": V1_EMBEDDINGS,
    "/api/embed": API_EMBED,
    "/api/embeddings": API_EMBEDDINGS,
    "/api/embed and /api/embeddings: options": EMBED_OPTIONS,
    "/api/show": API_SHOW,
    "/api/pull": API_PULL,
    "/api/delete": API_DELETE,
    "/api/create": API_CREATE,
    "/v1/rerank and /rerank": RERANK,
    "each of messages (/v1/chat/completions, /api/chat, /apply-template)": CHAT_MESSAGE,
}

_OPTIONS = {"/api/chat": API_OPTIONS, "/api/generate": API_OPTIONS,
            "/api/embed": EMBED_OPTIONS, "/api/embeddings": EMBED_OPTIONS}
"""The fields of each Ollama route's ``options`` object."""


def audit(route: str, body: dict[str, Any]) -> None:
    """Refuse ``body``'s first refused or unknown field (and, on Ollama's routes, of its
    ``options``) with a 400 naming it."""
    ROUTES[route].audit(body, route=route)
    options = body.get("options")
    if route in _OPTIONS and isinstance(options, dict):
        _OPTIONS[route].audit(options, route=route, where="options.")


def fields_table() -> str:
    """docs/api.md's table: every field of each route and what happens to it."""
    lines = ["| Route | Honoured | Accepted and ignored | Refused with 400 |",
             "|---|---|---|---|"]
    for route, rule in ROUTES.items():
        honoured = ", ".join(f"`{n}`" for n in rule.honoured)
        if rule.elsewhere:
            honoured += "; tool calling, structured output, FIM: " + ", ".join(
                f"`{n}`" for n in rule.elsewhere)
        ignored = "; ".join(f"`{n}` ({why})" for n, why in rule.ignored.items()) or "none"
        refused = "".join(f"`{n}`" + (f" (except {r.allowed})" if r.allowed else "")
                          + (", " if i < len(rule.refused) - 1 else "; ")
                          for i, (n, r) in enumerate(rule.refused.items()))
        lines.append(f"| `{route}` | {honoured} | {ignored} | {refused}any other field |")
    return "\n".join(lines)
