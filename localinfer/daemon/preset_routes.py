"""Ollama's routes that make models: ``/api/create`` (a preset over an installed model, and
with ``quantize`` a new quantized file first: store/create.py), ``/api/copy`` (a preset under
another name) and ``/api/push`` (refused: there is no registry to push to).

``/api/create`` streams Ollama's status objects (``{"status": "reading model metadata"}`` ...
``{"status": "success"}``; quantizing adds ``digest``, ``total`` and ``completed``), or with
``"stream": false`` answers once. A request that cannot be made (an unknown ``from``, a bad
parameter, a path) fails with its status code before the stream starts. The legacy
``modelfile`` field is read as a Modelfile, with its paths refused as ``from``'s are.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest, LocalInferError, ModelNotFound
from ..protocol import json_line
from ..store.create import create_preset
from ..store.presets import (
    ROLES,
    CreateRequest,
    check_parameters,
    hub_model_name,
    parse_modelfile,
    validate_preset_name,
)
from .bridge import BridgeResponse, ThreadBridge
from .error_replies import guarded
from .fields import audit
from .requests import Fields, read_json
from .state import DaemonState

_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")


class _CreateJob(ThreadBridge[dict[str, Any]]):
    """A create running on its own thread, its statuses handed to the request. It is not
    stopped when the client leaves: a quantize runs to its end (or its error) and tidies up."""

    def cancel(self) -> None:
        pass


def routes(state: DaemonState) -> list[Route]:
    manager = state.manager

    async def create(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/create", body)
        f = Fields(body)
        ask = await asyncio.to_thread(_create_request, manager.store, body, f)
        stream = f.boolean("stream", True)
        job = _CreateJob()

        def status(text: str, done: int | None, total: int | None) -> None:
            item: dict[str, Any] = {"status": text}
            if total is not None:
                item.update(digest="0", total=total, completed=done or 0)
            job.put(item)

        def run() -> None:
            try:
                create_preset(manager.store, ask, from_api=True, status=status)
            except BaseException as exc:  # noqa: BLE001 - raised in the event loop
                job.end(exc)
            else:
                job.end()

        threading.Thread(target=run, name=f"create {ask.name}", daemon=True).start()
        items = job.__aiter__()
        first = await items.__anext__()  # a request that cannot be made fails here
        if not stream:
            last = first
            async for item in items:
                last = item
            return JSONResponse(last)

        async def lines() -> AsyncIterator[str]:
            yield json_line(first) + "\n"
            try:
                async for item in items:
                    yield json_line(item) + "\n"
            except Exception as exc:  # noqa: BLE001 - headers sent: report it in the stream
                message = exc.message if isinstance(exc, LocalInferError) else str(exc)
                yield json_line({"error": message}) + "\n"

        return BridgeResponse(lines(), job, media_type="application/x-ndjson")

    async def copy(request: Request) -> Response:
        body = await read_json(request)
        f = Fields(body)
        source, destination = f.string("source"), f.string("destination")
        ask = CreateRequest(name=validate_preset_name(destination), source=source)
        if source.strip().lower() != ask.name:
            await asyncio.to_thread(create_preset, manager.store, ask, from_api=True)
        return Response(status_code=200)

    async def push(request: Request) -> Response:
        raise InvalidRequest("/api/push is not supported: localinfer has no registry to push"
                             " to. Share a preset as its Modelfile (`localinfer show NAME"
                             " --modelfile`) and the model it is over.")

    async def blobs(request: Request) -> Response:
        raise InvalidRequest("/api/blobs is not supported: localinfer takes no uploads. Add a"
                             " GGUF file on this machine with `localinfer add PATH`, then name"
                             " it in 'from' or by its SHA-256 in 'files'.")

    return [
        Route("/api/create", guarded(state, "api/create", create), methods=["POST"]),
        Route("/api/copy", guarded(state, "api/copy", copy), methods=["POST"]),
        Route("/api/push", guarded(state, "api/push", push), methods=["POST"]),
        Route("/api/blobs/{digest}", guarded(state, "api/blobs", blobs),
              methods=["POST", "HEAD"]),
    ]


def _create_request(store, body: dict[str, Any], f: Fields) -> CreateRequest:
    """/api/create's fields as a CreateRequest (blocking: ``files`` looks in the store)."""
    name = f.string("model", None) or f.string("name", None)
    if not name:
        raise InvalidRequest("'model' is required: the name of the preset to make.")
    modelfile = f.string("modelfile", None)
    if modelfile:
        # The legacy field: its FROM and ADAPTER paths are refused as 'from' paths are.
        ask = parse_modelfile(modelfile, Path("/nonexistent-base"), name)
        if ask.source is not None and ask.source.startswith("/"):
            raise InvalidRequest("'modelfile': FROM must name an installed model; paths are"
                                 " not accepted over the API.")
    else:
        ask = CreateRequest(name=validate_preset_name(name))
    source = f.string("from", None)
    if source is not None:
        if ("/" in source or "\\" in source or source.endswith(".gguf")) and \
                not hub_model_name(source):
            raise InvalidRequest("'from' must name an installed model or preset; paths are not"
                                 " accepted over the API (add a file with `localinfer add"
                                 " PATH`).")
        ask.source = source
    files = body.get("files")
    if files:
        ask.source = _by_digest(store, files)
    if f.data.get("system") is not None:
        ask.system = f.string("system")
    if f.data.get("template") is not None:
        ask.template = f.string("template")
    parameters = body.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object of parameter names to values.")
        ask.parameters.update(check_parameters(parameters))
    messages = body.get("messages")
    if messages is not None:
        ask.messages = _messages(messages)
    license_ = body.get("license")
    if license_ is not None:
        items = license_ if isinstance(license_, list) else [license_]
        if not all(isinstance(text, str) for text in items):
            raise InvalidRequest("'license' must be a string or a list of strings.")
        ask.license = list(items)
    ask.quantize = f.string("quantize", None)
    return ask


def _by_digest(store, files: Any) -> str:
    """``files`` ({file name: "sha256:<hex>"}) -> the installed model with that SHA-256:
    localinfer takes no blob uploads, so only a file already in the store can be named."""
    if not isinstance(files, dict) or len(files) != 1:
        raise InvalidRequest("'files' must name one GGUF file: {\"name.gguf\": \"sha256:...\"}"
                             " (safetensors directories are not converted).")
    (file_name, digest), = files.items()
    match = _DIGEST.match(str(digest))
    if match is None:
        raise InvalidRequest(f"'files.{file_name}' must be \"sha256:\" and 64 hex digits.")
    for model in store.installed():
        if model.sha256 == match.group(1):
            return model.name
    raise ModelNotFound(f"no installed model has the SHA-256 of 'files.{file_name}'"
                        f" ({match.group(1)[:12]}…): localinfer takes no blob uploads; add"
                        " the file on this machine with `localinfer add PATH` first.")


def _messages(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise InvalidRequest("'messages' must be a list of {\"role\", \"content\"} objects.")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or item.get("role") not in ROLES or \
                not isinstance(item.get("content"), str):
            raise InvalidRequest(f"'messages[{i}]' must have a role ({', '.join(ROLES)}) and"
                                 " a string content.")
        out.append((item["role"], item["content"]))
    return out
