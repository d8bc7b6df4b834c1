"""The command line, run as a user would run it (a subprocess), on the real starter model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from localinfer import errors
from localinfer.cli import build_parser


def cli(*args: str, stdin: str | None = None, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "localinfer", *args], input=stdin,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)


def test_help_and_version():
    out = cli("--help")
    assert out.returncode == 0 and "run" in out.stdout and "Exit codes" in out.stdout
    assert cli("--version").stdout.startswith("localinfer ")


def test_the_exit_codes_in_help_come_from_the_error_tree():
    epilog = build_parser().epilog
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.LocalInferError)}
    assert codes >= {1, 2, 3, 9, 130}
    for code in codes | {0, 70}:
        assert re.search(rf"[ :]{code} [a-z]", epilog), (code, epilog)
    assert "3 model not found" in epilog and "130 cancelled" in epilog


def test_building_the_parser_loads_no_engine_daemon_ui_or_store():
    heavy = ["llama_cpp", "textual", "starlette", "uvicorn", "httpx", "huggingface_hub",
             "localinfer.runtime.engine", "localinfer.store", "localinfer.client",
             "localinfer.tui.app", "localinfer.daemon.server", "localinfer.bench.engine_bench"]
    code = ("import sys, localinfer.cli; localinfer.cli.build_parser();"
            f" print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.model
def test_run_streams_text_then_a_stats_line(starter_path):
    out = cli("run", "gemma3:270m", "The capital of France is", "-n", "12", "-t", "0")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) >= 4
    last = out.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"prompt \d+ tok · TTFT \d+ ms · prefill \d+ tok/s · "
                        r"decode [\d.]+ tok/s · 12 tok · length", last), last


@pytest.mark.model
def test_run_json(starter_path):
    out = cli("run", "gemma3:270m", "-", "--json", "-n", "8", "-t", "0", "--seed", "1",
              stdin="Water is made of")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["model"] == "gemma3:270m-q4_k_m"
    assert result["usage"]["completion_tokens"] == 8 and result["finish_reason"] == "length"
    assert result["timings"]["decode_tps"] > 0 and result["text"]


@pytest.mark.model
def test_run_chat_mode(starter_path):
    out = cli("run", str(starter_path), "Say hello.", "--chat", "--system", "Be brief.",
              "-n", "8", "-t", "0")
    assert out.returncode == 0, out.stderr


@pytest.mark.model
def test_list_shows_the_installed_starter(starter_path):
    out = cli("list")
    assert out.returncode == 0
    assert re.search(r"gemma3:270m-q4_k_m\s+Q4_K_M\s+253\.1 MB\s+/", out.stdout)
    assert json.loads(cli("list", "--json").stdout)[0]["quant"] == "Q4_K_M"


@pytest.mark.parametrize("args, code, words", [
    (["run", "nosuch:model", "hi"], 3, ["model not found", "unknown model 'nosuch:model'"]),
    (["run", "/does/not/exist.gguf", "hi"], 3, ["does not exist"]),
    (["run", "gemma3:270m", "hi", "-n", "0"], 2, ["max_tokens must be at least 1"]),
    (["run", "gemma3:270m", "hi", "--temperature", "-2"], 2, ["temperature"]),
    # A relative path that climbs out of the working directory is a path, not a name; it has to
    # reach /etc/passwd from wherever the tests run (CI checks out deeper than a dev does).
    (["run", os.path.relpath("/etc/passwd"), "hi"], 4, ["not a GGUF model file"]),
    (["run", "bad..name", "hi"], 2, ["invalid model name"]),
])
def test_bad_input_is_one_line_and_an_exit_code(args, code, words):
    out = cli(*args)
    assert out.returncode == code, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localinfer: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.model
def test_a_q8_cache_without_flash_attention_is_refused_before_loading(starter_path):
    out = cli("run", "gemma3:270m", "hi", "--kv-type", "q8_0", "--flash-attn", "off")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert "needs flash attention" in lines[-1] and "--flash-attn on" in lines[-1]
    assert "Loaded" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.model
def test_a_prompt_that_is_empty_or_not_utf8_is_refused_before_loading(starter_path):
    """Both loaded the model first; the bytes came out as 'an unpaired UTF-16 surrogate'."""
    for args, stdin, words in ((["run", "gemma3:270m", ""], None, "the prompt is empty"),
                               (["run", "gemma3:270m", "-"], "", "the prompt is empty")):
        out = cli(*args, stdin=stdin)
        assert out.returncode == 2 and words in out.stderr and "Loaded" not in out.stderr
    raw = subprocess.run([sys.executable, "-m", "localinfer", "run", "gemma3:270m", "-"],
                         input=b"\xff\xfe bad", capture_output=True, timeout=300)
    assert raw.returncode == 2
    assert b"not UTF-8 text (byte 0xff at offset 0)" in raw.stderr
    assert b"Loaded" not in raw.stderr
    # A byte-order mark (a Windows editor's file) is no text of the prompt.
    bom = subprocess.run([sys.executable, "-m", "localinfer", "run", "gemma3:270m", "-",
                          "--json", "-n", "1"], input="\ufeffHello".encode(),
                         capture_output=True, timeout=300)
    plain = subprocess.run([sys.executable, "-m", "localinfer", "run", "gemma3:270m", "-",
                            "--json", "-n", "1"], input=b"Hello", capture_output=True,
                           timeout=300)
    assert bom.returncode == plain.returncode == 0, bom.stderr
    assert json.loads(bom.stdout)["usage"]["prompt_tokens"] == \
        json.loads(plain.stdout)["usage"]["prompt_tokens"]


@pytest.mark.model
def test_a_context_llama_cpp_rounds_up_is_said(starter_path):
    """--ctx 64 ran with 256 without a word; a later "context window is 256" contradicted it."""
    out = cli("run", "gemma3:270m", "Hello", "-n", "2", "--ctx", "64")
    assert out.returncode == 0, out.stderr
    assert "asked for a context of 64 tokens; llama.cpp sizes it in steps of 256: it is 256" \
        in out.stderr


@pytest.mark.model
def test_prompt_longer_than_the_context(starter_path):
    out = cli("run", "gemma3:270m", "-", "--ctx", "256", stdin="word " * 400)
    assert out.returncode == 6
    assert re.search(r"the prompt is [45]\d\d tokens but the context window is 256 tokens",
                     out.stderr), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, words", [
    (["run", "gemma3:270m", "hi", "--threads", "0"], ["--threads", "at least 1, got 0"]),
    (["run", "gemma3:270m", "hi", "--threads", "-3"], ["--threads", "at least 1, got -3"]),
    (["run", "gemma3:270m", "hi", "--ctx", "0"], ["--ctx", "at least 1, got 0"]),
    (["run", "gemma3:270m", "hi", "--gpu-layers", "-2"], ["--gpu-layers", "-1 (all) or 0"]),
    (["bench", "--llama-server", "/nonexist", "--quick"], ["--llama-server goes with --editor"]),
    (["bench", "--quick", "--lengths", "100,200"], ["--lengths goes with --prefill"]),
    (["bench", "--editor", "--ctx", "512"], ["--editor runs `localinfer serve`"]),
])
def test_loading_flags_out_of_range_are_refused_before_anything_loads(home, args, words):
    out = cli(*args)
    assert out.returncode == 2, out.stderr
    for word in words:
        assert word in out.stderr, out.stderr
    assert "Loading" not in out.stderr and "Traceback" not in out.stderr


def test_a_home_that_cannot_be_written_is_a_store_error(monkeypatch, capsys):
    import errno

    import localinfer.cli as cli_module

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/home/me/.localinfer/data")

    monkeypatch.setattr(cli_module, "load_config", read_only)
    assert cli_module.main(["list"]) == errors.StoreError.exit_code
    err = capsys.readouterr().err
    assert err == ("localinfer: store error: Read-only file system (/home/me/.localinfer/data):"
                   " make it writable, or point LOCALINFER_HOME at a directory this user can"
                   " write.\n")


def test_not_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model, it is a text file " * 10)
    out = cli("run", str(bad), "hi")
    assert out.returncode == 4 and "not a GGUF model file" in out.stderr


def test_bad_config_file_is_reported(home):
    cfg = home / "config"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("ctx = 'huge'\n")
    out = cli("list", env={"LOCALINFER_HOME": str(home)})
    assert out.returncode == 2 and "ctx must be int" in out.stderr


def test_debug_shows_the_traceback():
    out = cli("--debug", "run", "nosuch:model", "hi")
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_a_file_that_is_not_gguf_is_named_as_typed(tmp_path):
    (tmp_path / "README.md").write_text("# not a model\n")
    out = subprocess.run([sys.executable, "-m", "localinfer", "run", "README.md", "hi"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 4, out.stderr
    assert out.stderr == ("localinfer: invalid model file: README.md is not a GGUF model"
                          " file: it starts with b'# no', not b'GGUF'.\n")
    out = cli("run", "NoSuch:Model", "hi")  # a name: quoted as typed, looked up in lower case
    assert out.returncode == 3 and "unknown model 'NoSuch:Model'" in out.stderr, out.stderr


@pytest.mark.parametrize("args, usage, hint", [
    (["run", "gemma3:270m", "hi", "--max-tokns", "3"], "usage: localinfer run ",
     "localinfer run: error: unrecognized arguments: --max-tokns 3; did you mean"
     " --max-tokens?"),
    (["rnu", "gemma3:270m", "hi"], "usage: localinfer [-h]", "; did you mean run?"),
    (["run", "gemma3:270m", "hi", "--kv-type", "q8"], "usage: localinfer run ",
     "did you mean q8_0?"),
    (["--debgu", "list"], "usage: localinfer [-h]", "did you mean --debug?"),
    (["list", "--jsno"], "usage: localinfer list ", "did you mean --json?"),
])
def test_a_mistyped_argument_gets_the_commands_usage_and_a_suggestion(args, usage, hint):
    out = cli(*args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(usage), out.stderr
    assert hint in out.stderr.strip().splitlines()[-1], out.stderr


def _can_offload() -> bool:
    from localinfer.hardware.probe import probe_build

    return any(b != "CPU" for b in probe_build().backends)


def test_gpu_layers_with_no_gpu_to_offload_to_are_refused(home):
    if _can_offload():
        pytest.skip("llama.cpp can offload to a GPU here")
    out = cli("run", "gemma3:270m", "hi", "--gpu-layers", "5")
    assert out.returncode == 2
    assert out.stderr.startswith("localinfer: bad configuration: --gpu-layers 5: llama.cpp has"
                                 " no GPU to offload to here (its backends: CPU;"), out.stderr
    assert "Loaded" not in out.stderr
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("gpu_layers = 5\n")
    out = cli("serve", "--no-tcp", "--idle-exit", "1")  # exits at once if it ever starts
    assert out.returncode == 2, out.stderr
    assert "gpu_layers = 5 (config.toml or LOCALINFER_GPU_LAYERS): llama.cpp has no GPU" in \
        out.stderr
    (home / "config" / "config.toml").write_text("gpu_layers = -1\n")  # all: fine anywhere
    assert cli("run", "nosuch:model", "hi").returncode == 3


def test_more_threads_than_cores_are_cut_with_a_warning(home):
    cores = len(os.sched_getaffinity(0))
    out = cli("run", "nosuch:model", "hi", "--threads", str(cores + 1))
    assert out.returncode == 3
    assert out.stderr.splitlines()[0] == (f"localinfer: warning: --threads {cores + 1} is more"
                                          f" than the {cores} logical cores here; using"
                                          f" {cores}.")
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("threads = 4096\n")
    out = cli("run", "nosuch:model", "hi")
    assert out.stderr.splitlines()[0].startswith(
        "localinfer: warning: threads = 4096 (config.toml or LOCALINFER_THREADS) is more than")


def test_layers_on_the_gpu_are_counted_as_llama_cpp_counts_them():
    from localinfer.cli.common import gpu_layers_text

    # ModelInfo, llama.cpp, --gpu-layers and `plan` count the output layer as one more.
    assert gpu_layers_text(0, 18) == "0/19"
    assert gpu_layers_text(10, 18) == "10/19"
    assert gpu_layers_text(19, 18) == "19/19"


@pytest.mark.model
def test_run_and_plan_count_the_layers_alike(starter_path):
    out = cli("run", "gemma3:270m", "hi", "-n", "1", "--no-daemon")
    assert out.returncode == 0, out.stderr
    loaded = re.search(r"Loaded gemma3:270m-q4_k_m \(Q4_K_M, (\d+/\d+) layers on GPU\)",
                       out.stderr)
    assert loaded, out.stderr
    plan = cli("plan", "gemma3:270m-q4_k_m")
    row = next(line for line in plan.stdout.splitlines()
               if line.startswith("gemma3:270m-q4_k_m"))
    assert loaded[1] in row.split(), (loaded[1], row)


@pytest.mark.model
def test_all_layers_on_the_gpu_runs_on_the_cpu_where_there_is_none(starter_path):
    """-1, "all layers wherever a GPU is found" (the hint the refusal of a count gives):
    a CPU build's llama.cpp says it offloaded them all, and offloads none."""
    if _can_offload():
        pytest.skip("llama.cpp can offload to a GPU here")
    out = cli("run", "gemma3:270m", "hi", "-n", "2", "--no-daemon", "--gpu-layers", "-1")
    assert out.returncode == 0, out.stderr
    assert "(Q4_K_M, 0/19 layers on GPU)" in out.stderr


@pytest.mark.model
@pytest.mark.parametrize("after_s", [0.0, 0.15, 0.4])
def test_ctrl_c_while_a_model_loads_exits_130_cleanly(starter_path, after_s):
    """Ctrl-C as the load runs: llama.cpp calls back into Python (its log, the progress), where
    a KeyboardInterrupt was printed by ctypes and dropped (the run went on to generate), and
    an exit with the load still in llama.cpp crashed now and then."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "run", "gemma3:270m",
                             "Once upon a time", "-n", "40", "--no-daemon"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = ""
    while "Loading" not in seen:
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (seen + err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_think_without_a_chat_is_refused_before_anything_loads(home):
    out = cli("run", "gemma3:270m", "hi", "--think", "on", "--no-daemon")
    assert out.returncode == 2, out.stderr
    assert "--think is for a chat: add --chat" in out.stderr


def test_chat_outside_a_terminal_says_so(home):
    """It drew its full-screen UI into a pipe and waited for ever (a wrong model's error
    shown only inside it)."""
    out = cli("chat", "nosuch:1b", stdin="")
    assert out.returncode == 2 and "not a terminal" in out.stderr
    assert "localinfer run" in out.stderr


def test_worker_arguments_are_checked_before_it_starts(tmp_path):
    # --port 65535 was an internal error (its description port is 65536), --threads -1 was
    # taken (a negative bandwidth published), a --cache under a file an internal error.
    (tmp_path / "afile").write_text("")
    for args, says in ((["--port", "65535"], "from 1 to 65534"),
                       (["--port", "0"], "from 1 to 65534"),
                       (["--threads", "-1"], "at least 1"),
                       (["--cache", str(tmp_path / "afile" / "sub")], "cannot make that folder")):
        out = cli("worker", *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
