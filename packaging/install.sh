#!/bin/sh
# Install localinfer (editable) into a virtual environment, with llama.cpp built with its RPC
# backend, which `localinfer worker` and `serve --workers` need (README: Beyond one machine).
# Usage: packaging/install.sh VENV [EXTRAS]    e.g. packaging/install.sh .venv starter,test
#
# pip builds llama-cpp-python from source with CMAKE_ARGS, but reuses a wheel it cached from
# an earlier build without looking at CMAKE_ARGS; when the installed build lacks RPC, the
# cached wheel is dropped and llama-cpp-python rebuilt once (5-10 minutes), then cached.
set -eu
venv=$1
extras=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
export CMAKE_ARGS="-DGGML_RPC=on ${CMAKE_ARGS:-}"
"$venv/bin/pip" install -e "$root${extras:+[$extras]}"
has_rpc='import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_rpc() else 1)'
if ! "$venv/bin/python" -c "$has_rpc"; then
    version=$("$venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)')
    echo "install.sh: llama-cpp-python $version came from a wheel built without RPC;" \
         "rebuilding it with RPC (5-10 minutes, once)" >&2
    "$venv/bin/pip" cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
    "$venv/bin/pip" install --force-reinstall --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version"
    "$venv/bin/python" -c "$has_rpc"
fi
