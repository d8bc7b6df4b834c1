"""Rendering a conversation into a prompt with the model's Jinja chat template.

The template comes from the GGUF file (``tokenizer.chat_template``) when it has one, else from
the built-in templates below, named per family in ``models.toml``. Templates run in Jinja's
immutable sandbox, like Hugging Face transformers and llama-cpp-python do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequest, ModelLoadError
from .types import Message, ToolCall

# Lenient versions of the families' official templates: they accept a system prompt and do not
# insist that roles alternate (API clients send all sorts of conversations).
BUILTIN_TEMPLATES: dict[str, str] = {
    "gemma": (
        "{{ bos_token }}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
        "{%- set loop_messages = messages[1:] -%}"
        "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
        "{%- endif -%}"
        "{%- for message in loop_messages -%}"
        "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
        "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
        "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{%- for message in messages -%}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
        "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{%- endif -%}"
    ),
    "chatml": (
        "{%- for message in messages -%}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
    ),
    "mistral": (
        "{{ bos_token }}"
        "{%- set system = messages[0]['content'] + '\n\n' if messages and "
        "messages[0]['role'] == 'system' else '' -%}"
        "{%- for message in messages if message['role'] != 'system' -%}"
        "{%- if message['role'] == 'user' -%}"
        "{{ '[INST] ' + (system if loop.first else '') + message['content'] | trim + ' [/INST]' }}"
        "{%- else -%}{{ ' ' + message['content'] | trim + eos_token }}{%- endif -%}"
        "{%- endfor -%}"
    ),
    # OpenAI's "harmony" format (gpt-oss); its GGUF files carry the full template.
    "harmony": (
        "{%- for message in messages -%}"
        "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|start|>assistant' }}{%- endif -%}"
    ),
    "phi3": (
        "{%- for message in messages -%}"
        "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
    ),
}

class ChatTemplate:
    """A compiled chat template plus the special-token strings it refers to."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"the model's chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.supports_tools = "tools" in jinja2.meta.find_undeclared_variables(
            env.parse(source))
        """Whether the template renders a ``tools`` list (the model was taught to call
        functions); a request with tools for one that does not is refused."""

    @classmethod
    def named(cls, name: str, **tokens: str) -> ChatTemplate:
        try:
            return cls(BUILTIN_TEMPLATES[name], **tokens)
        except KeyError:
            known = ", ".join(sorted(BUILTIN_TEMPLATES))
            raise ModelLoadError(f"unknown chat template {name!r} (known: {known}).") from None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Sequence[dict[str, Any]] | None = None,
               template_vars: Mapping[str, Any] | None = None) -> str:
        """The prompt text. ``tools`` are OpenAI-shaped function definitions (``{"type":
        "function", "function": {...}}``), which is what Hugging Face's templates take.
        ``template_vars`` are more variables for the template (``enable_thinking``,
        ``reasoning_effort``); they cannot replace the ones set here."""
        if not messages:
            raise InvalidRequest("messages must not be empty.")
        payload: list[dict[str, Any]] = [_message_json(m) for m in messages]
        extra: dict[str, Any] = {}
        if tools or any(m.tool_calls for m in messages):
            if not self.supports_tools:
                raise InvalidRequest("this model's chat template has no tool support, so it"
                                     " was not taught to call functions: send the request"
                                     " without 'tools' and tool calls, or use a model that"
                                     " has it (qwen3, llama3.1, mistral...).")
        if tools:
            extra["tools"] = list(tools)
        try:
            return self._template.render(
                **(template_vars or {}),
                messages=payload,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except _TemplateRejected as exc:
            raise InvalidRequest(
                f"the model's chat template rejected the messages: {exc}") from None
        except Exception as exc:  # a template is code from the model file: any error is its
            raise InvalidRequest(f"the model's chat template failed: {exc}") from None


def _message_json(message: Message) -> dict[str, Any]:
    """A message as Hugging Face's templates read it: calls with their arguments as an
    object, a tool result with its call's id and function name."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_call_json(call) for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_name:
        out["name"] = message.tool_name
    return out


def _call_json(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments)
    except json.JSONDecodeError:  # the client's own text: shown as it came
        arguments = call.arguments
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": arguments}}


class _TemplateRejected(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRejected(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)
