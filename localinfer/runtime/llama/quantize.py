"""Quantizing a GGUF file with llama.cpp's own quantizer (``llama_model_quantize``), as
``llama-quantize`` does: one blocking call that writes the output file."""

from __future__ import annotations

import ctypes
import os

import llama_cpp as L

from ...errors import LocalInferError
from .native import _init, _llama_said


def quantize_file(source: str | os.PathLike[str], target: str | os.PathLike[str], ftype: int,
                  *, allow_requantize: bool = False, n_threads: int = 0) -> None:
    """Write ``source`` quantized to llama.cpp's file type ``ftype`` (``gguf.FILE_TYPES``'
    numbers) into ``target``; LocalInferError with llama.cpp's words when it fails."""
    _init()
    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = allow_requantize
    params.nthread = n_threads
    rc = L.llama_model_quantize(os.fsencode(source), os.fsencode(target),
                                ctypes.byref(params))
    if rc != 0:
        raise LocalInferError(f"llama.cpp could not quantize {source} (error {rc})"
                              f"{_llama_said()}")
