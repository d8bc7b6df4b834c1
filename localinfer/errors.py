"""Every error localinfer shows a user, in one tree.

Each error has a short ``title`` and a message that says what to do about it. The CLI prints
``localinfer: <title>: <message>`` on one line and exits with the class's ``exit_code``; the
daemon maps ``http_status`` into a JSON ``error`` body.

    LocalInferError                      exit 1
    ├── ConfigError                      exit 2   bad config.toml, environment or arguments
    │   └── InvalidRequest               exit 2   a parameter out of range (max_tokens <= 0, ...)
    ├── ModelNotFound                    exit 3   unknown name, missing path, extra not installed
    ├── InvalidModelFile                 exit 4   not GGUF, truncated, absurd header
    ├── ModelLoadError                   exit 5   llama.cpp refused to load the file
    ├── ModelTooLarge                    exit 5   a model the memory plan can never fit (HTTP 400)
    ├── ContextOverflow                  exit 6   prompt longer than the context window
    ├── StoreError                       exit 7   disk full, checksum mismatch, download failed
    │   ├── DownloadError                exit 7   the Hub unreachable or the connection lost
    │   ├── AccessDenied                 exit 7   a gated or private repo (HTTP 401/403)
    │   ├── OfflineError                 exit 7   a download asked for in offline mode
    │   └── ModelInUse                   exit 7   removing a model the daemon has loaded
    ├── DaemonError                      exit 8   daemon unreachable, already running, port in use
    │   └── Busy                         exit 8   the request queue is full (HTTP 503)
    ├── BackendUnavailable               exit 9   llama-cpp-python missing or unusable
    ├── WorkerError                      exit 10  an RPC worker unreachable, refused or gone
    │   └── WorkerLost                   exit 10  a worker died under a loaded model (unloaded)
    └── Cancelled                        exit 130 a generation or download cancelled (Ctrl+C)

Exit code 2 is also what argparse uses for usage errors.
"""

from __future__ import annotations


class LocalInferError(Exception):
    """Base of all user-facing errors."""

    title = "error"
    exit_code = 1
    http_status = 500

    def __init__(self, message: str, *, title: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if title is not None:
            self.title = title

    def one_line(self) -> str:
        """``title: message`` with no newlines, for a terminal or a log."""
        return f"{self.title}: {' '.join(self.message.split())}"


class ConfigError(LocalInferError):
    title = "bad configuration"
    exit_code = 2
    http_status = 400


class InvalidRequest(ConfigError):
    title = "invalid request"


def refuse_unknown_fields(value: dict[str, object], fields: set[str], where: str,
                          what: str) -> None:
    """Raise InvalidRequest naming the first field of ``value`` (a request's nested object at
    ``where``; "" for the body) that ``what`` does not have: never a field dropped in silence."""
    extra = sorted(set(value) - fields)
    if extra:
        name = f"{where}.{extra[0]}" if where else extra[0]
        raise InvalidRequest(f"'{name}' is not a field of {what}; send"
                             f" {', '.join(sorted(fields))}.")


class ModelNotFound(LocalInferError):
    title = "model not found"
    exit_code = 3
    http_status = 404


class InvalidModelFile(LocalInferError):
    title = "invalid model file"
    exit_code = 4
    http_status = 400


class ModelLoadError(LocalInferError):
    title = "model failed to load"
    exit_code = 5
    http_status = 500


class ModelTooLarge(LocalInferError):
    """A model that needs more memory than the machine can give, even with no other loaded."""

    title = "model too large"
    exit_code = 5
    http_status = 400


class ContextOverflow(LocalInferError):
    title = "prompt too long"
    exit_code = 6
    http_status = 400
    # 0: not known (an error rebuilt from the daemon's JSON carries only its message).
    n_prompt = 0
    n_ctx = 0

    def __init__(self, message: str, *, n_prompt: int = 0, n_ctx: int = 0) -> None:
        super().__init__(message)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class StoreError(LocalInferError):
    title = "model store error"
    exit_code = 7
    http_status = 500


class DownloadError(StoreError):
    title = "download failed"
    http_status = 502


class AccessDenied(StoreError):
    title = "access denied"
    http_status = 403


class OfflineError(StoreError):
    title = "offline"
    http_status = 503


class ModelInUse(StoreError):
    title = "model in use"
    http_status = 409


class DaemonError(LocalInferError):
    title = "daemon error"
    exit_code = 8
    http_status = 503


class Busy(DaemonError):
    title = "busy"
    http_status = 503


class BackendUnavailable(LocalInferError):
    title = "llama.cpp backend unavailable"
    exit_code = 9
    http_status = 500


class WorkerError(LocalInferError):
    """An RPC worker (``localinfer worker``, llama.cpp's ``rpc-server``) that cannot be used:
    unreachable, of another protocol version, or serving someone else."""

    title = "worker unavailable"
    exit_code = 10
    http_status = 503


class WorkerLost(WorkerError):
    """The process holding a model with RPC workers died (a worker stopped responding and
    llama.cpp aborted it): the model is unloaded and its requests end with this."""

    title = "worker lost"


class StepInterrupted(LocalInferError):
    """A decode stopped before its end because the engine asked (``Backend.interrupt``): its
    requests were all cancelled, or a more urgent one came. The KV cache holds what the
    decode had finished (``Backend.seq_length``)."""

    title = "step interrupted"


class Cancelled(LocalInferError):
    title = "cancelled"
    exit_code = 130
    http_status = 499
