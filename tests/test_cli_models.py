"""pull, list, show, rm, add and plan-by-header as a user runs them: `localinfer` in a
subprocess, the Hub played by tests/hub_server.py (reached through HF_ENDPOINT)."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys

import pytest

import ggufgen
from daemon_util import fake_factory, install_fake_models, serve
from hub_server import STARTER_BYTES, STARTER_SHA256
from localinfer import gguf
from localinfer.catalog import load_catalog
from localinfer.runtime.chat_template import BUILTIN_TEMPLATES
from localinfer.store import ModelStore

pytest_plugins = ["hub_fixtures"]  # local_hub, hub_catalog, hub_home
NAME = "tinygemma:270m-q4_k_m"


def cli(*args: str, env: dict | None = None, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "localinfer", *args], input=stdin,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)


def one_line_error(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("localinfer: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[-1]


def test_pull_list_show_rm(hub_home, local_hub):
    out = cli("pull", "tinygemma:270m")
    assert out.returncode == 0, out.stderr
    assert re.search(r"^tinygemma:270m -> tinygemma:270m-q4_k_m: the best quality that fits",
                     out.stdout, re.MULTILINE), out.stdout
    assert f"pulled {NAME} (253.1 MB); verified against the Hub's SHA-256" in out.stdout
    assert re.search(r"Downloaded 253\.1 MB in [\d.]+s", out.stderr)
    assert local_hub.body_bytes() == STARTER_BYTES

    out = cli("list")
    assert re.search(rf"^{re.escape(NAME)}\s+Q4_K_M\s+253\.1 MB\s+/", out.stdout, re.MULTILINE)
    [entry] = json.loads(cli("list", "--json").stdout)
    assert entry["sha256"] == STARTER_SHA256 and entry["source"].startswith("hf:")

    out = cli("show", "tinygemma:270m")
    assert out.returncode == 0, out.stderr
    for expected in ("architecture    gemma3", "parameters      268.1M",
                     "quantization    Q4_K_M", "context length  32768 tokens",
                     "license         gemma", f"sha256          {STARTER_SHA256}",
                     "Chat template: built-in 'gemma'", "Plan for this machine:",
                     "all layers on the CPU"):
        assert expected in out.stdout, (expected, out.stdout)
    shown = json.loads(cli("show", NAME, "--json").stdout)
    assert shown["quant"] == "Q4_K_M" and shown["plan"]["candidates"][0]["fits"]
    assert shown["chat_template"] is None and shown["chat_template_builtin"] == "gemma"

    out = cli("rm", NAME)  # not a terminal, no --yes: refuses
    assert out.returncode == 2 and "pass --yes" in one_line_error(out)
    assert cli("list", "--json").stdout.count(NAME) == 1
    out = cli("rm", "tinygemma:270m", "--yes")
    assert out.returncode == 0 and f"removed {NAME} (deleted " in out.stdout
    assert "already gone" not in out.stdout  # it was there until rm deleted it
    assert json.loads(cli("list", "--json").stdout) == []


def ctrl_c_at_pause(local_hub, pause_at: int, *args: str) -> tuple[int, str]:
    """Run ``localinfer ARGS``, send it Ctrl+C once the Hub's download pauses at ``pause_at``
    bytes: (its exit code, its stderr). Ctrl+C as a terminal sends it, whatever this process
    inherited: a suite started in the background of a non-interactive shell ignores SIGINT,
    and Python then leaves it ignored."""
    local_hub.faults.pause_at = pause_at
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert local_hub.faults.paused.wait(120), "the download never reached the pause"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        local_hub.release()
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def test_ctrl_c_in_runs_first_use_pull_says_what_is_kept(hub_home, local_hub):
    # `run hf.co/...` pulls on first use: Ctrl+C there said only "interrupted", on the line
    # of the progress bar.
    from hub_server import REPO

    returncode, stderr = ctrl_c_at_pause(local_hub, 50_000_000, "run",
                                         f"hf.co/{REPO}:Q4_K_M", "hi", "--no-daemon")
    assert returncode == 130, stderr
    name = f"hf.co/{REPO.lower()}:q4_k_m"
    assert stderr.strip().splitlines()[-1].startswith(
        f"localinfer: cancelled: the pull of {name} was interrupted: "), stderr
    assert "run this command again" in stderr and ModelStore().partials()[0].name == name


def test_ctrl_c_leaves_a_download_that_resumes(hub_home, local_hub):
    returncode, stderr = ctrl_c_at_pause(local_hub, 100_000_000, "pull", NAME)
    assert returncode == 130, stderr
    error = stderr.strip().splitlines()[-1]
    match = re.fullmatch(rf"localinfer: cancelled: the pull of {re.escape(NAME)} was"
                         r" interrupted: ([\d.]+) MB of 253\.1 MB is kept in (\S+)\.partial;"
                         rf" run `localinfer pull {re.escape(NAME)}` again to resume\.", error)
    assert match, error
    partial = ModelStore().partials()[0]
    assert f"{partial.size_bytes / 1e6:.1f}" == match[1] and 0 < partial.size_bytes <= 100e6
    assert json.loads(cli("list", "--json").stdout) == []  # nothing half-done is listed
    assert f"Partial download: {NAME}" in cli("list").stdout

    local_hub.reset_log()
    out = cli("pull", NAME)
    assert out.returncode == 0, out.stderr
    assert f"Resuming at {partial.size_bytes / 1e6:.1f} MB of 253.1 MB." in out.stderr
    [get] = local_hub.requests("cdn", "GET")
    assert get.range == f"bytes={partial.size_bytes}-"
    assert local_hub.body_bytes() == STARTER_BYTES - partial.size_bytes
    [model] = json.loads(cli("list", "--json").stdout)
    assert model["sha256"] == STARTER_SHA256


def test_offline_pull_refuses_and_everything_else_works(hub_home, local_hub):
    for args, env in ((["--offline", "pull", NAME], {}), (["pull", NAME, "--offline"], {}),
                      (["pull", NAME], {"HF_HUB_OFFLINE": "1"})):
        out = cli(*args, env=env)
        assert out.returncode == 7, out.stderr
        assert "localinfer: offline: cannot download" in one_line_error(out)
    out = cli("--offline", "plan", NAME)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^{re.escape(NAME)}\s+0\.2G~", out.stdout, re.MULTILINE), out.stdout
    assert "Offline: 1 size(s) marked ~ are the catalog's estimates" in out.stdout
    assert cli("--offline", "list").returncode == 0
    assert local_hub.log == []  # nothing touched the network


def test_plan_reads_only_the_header_and_caches_it(hub_home, local_hub, starter_path):
    out = cli("plan", NAME)
    assert out.returncode == 0, out.stderr
    header_bytes = gguf.read_header(starter_path).data_offset
    served = local_hub.body_bytes()
    assert header_bytes <= served <= 1.5 * header_bytes  # 6.5 MB of a 253 MB file
    assert re.search(rf"^{re.escape(NAME)}\s+0\.2G\s+yes", out.stdout, re.MULTILINE), out.stdout
    assert f"({served / 1e6:.1f} MB, HTTP Range requests; cached)" in out.stdout
    # Cached: exact offline too, with nothing sent.
    local_hub.reset_log()
    out = cli("--offline", "plan", NAME)
    assert re.search(rf"^{re.escape(NAME)}\s+0\.2G\s+yes", out.stdout, re.MULTILINE), out.stdout
    assert local_hub.log == []


def test_errors_are_one_line_with_an_exit_code(hub_home, local_hub):
    for args, code, words in [
        (["pull", "tinygemma:gated-q4_k_m"], 7, "access denied: localinfer-test/gated-gemma"
                                                "-GGUF is a gated repo (HTTP 401)"),
        (["pull", "tinygemma:missing-q4_k_m"], 3, "model not found: the Hub has no repo"),
        (["pull", "nope:1b"], 3, "model not found: the catalog has no model 'nope:1b'"),
        (["pull", "../x.gguf"], 2, "is a path"),
        (["show", "tinygemma:270m"], 3, "not installed: `localinfer plan tinygemma:270m`"),
        (["rm", "--yes", "tinygemma:270m"], 3, "is not installed"),
        (["add", "/does/not/exist.gguf"], 3, "does not exist"),
    ]:
        out = cli(*args)
        assert out.returncode == code, (args, out.stderr)
        assert words in one_line_error(out), (args, out.stderr)


def test_add_copies_or_links(home, starter_path):
    out = cli("add", str(starter_path), "--name", "mine:copy")
    assert out.returncode == 0, out.stderr
    assert re.search(r"added mine:copy-q4_k_m \(Q4_K_M, 253\.1 MB\): copied to /", out.stdout)
    out = cli("add", str(starter_path), "--link")
    assert f"added gemma-3:270m-q4_k_m (Q4_K_M, 253.1 MB): linked to {starter_path}" in \
        out.stdout
    listing = cli("list").stdout
    assert f"{starter_path} (linked)" in listing and "mine:copy-q4_k_m" in listing
    out = cli("rm", "--yes", "gemma-3:270m-q4_k_m", "mine:copy")
    assert out.returncode == 0, out.stderr
    assert f"(the linked file {starter_path} is kept)" in out.stdout
    assert starter_path.is_file() and json.loads(cli("list", "--json").stdout) == []
    out = cli("add", str(starter_path.parent))
    assert out.returncode == 3 and "not a file" in one_line_error(out)


def test_rm_asks_on_a_terminal(home, starter_path):
    cli("add", str(starter_path), "--link", "--name", "asked:1")

    def rm_with_answer(answer: str) -> str:
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "localinfer", "rm", "asked:1"],
                                stdin=follower, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        os.close(follower)
        os.write(leader, answer.encode() + b"\n")
        out, err = proc.communicate(timeout=60)
        os.close(leader)
        assert proc.returncode == 0, err
        assert "Remove asked:1-q4_k_m (a link to" in err
        return out

    assert "Nothing removed." in rm_with_answer("n")
    assert "asked:1-q4_k_m" in cli("list").stdout
    assert "removed asked:1-q4_k_m" in rm_with_answer("y")
    assert "asked:1" not in cli("list").stdout


def test_rm_refuses_while_the_daemon_has_the_model_loaded(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="hi")) as daemon:
        with daemon.uds() as http:
            assert http.post("/api/generate", json={"model": "fake:1b"}).status_code == 200
        out = cli("rm", "--yes", "fake:1b")
        assert out.returncode == 7
        assert "model in use: the daemon has fake:1b-f16 loaded; unload it with `localinfer" \
               " stop fake:1b-f16`" in one_line_error(out)
        assert ModelStore().find_installed("fake:1b-f16")
        with daemon.uds() as http:
            http.post("/localinfer/unload", json={"model": "fake:1b-f16"})
        out = cli("rm", "--yes", "fake:1b")
        assert out.returncode == 0, out.stderr


@pytest.fixture(autouse=True)
def _no_daemon_address(monkeypatch):
    """Clients find the daemon through this test's home, never an outside address."""
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)


def test_a_catalog_name_is_not_lent_to_a_file_of_another_architecture(home, tmp_path):
    """`add --name qwen3:1.7b-q4_k_m` of a 2-layer llama file made it "Qwen3" with Qwen3's
    license and sampling, and `pull qwen3:1.7b-q4_k_m` then said it was installed; and any
    llama file was shown as Llama 3.2 under its license."""
    model = tmp_path / "tiny.gguf"
    model.write_bytes(ggufgen.tiny_model())
    out = cli("add", str(model), "--name", "qwen3:1.7b-q4_k_m")
    assert out.returncode == 2 and "catalog's Qwen3" in out.stderr, out.stderr
    assert cli("add", str(model), "--name", "mine:7b").returncode == 0
    out = cli("show", "mine:7b")
    assert out.returncode == 0, out.stderr
    assert "Llama 3.2" not in out.stdout and "llama3.2" not in out.stdout, out.stdout


def test_a_linked_model_whose_file_is_gone(home, tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(ggufgen.tiny_model())
    out = cli("add", str(model), "--link", "--name", "tiny:1b")
    assert out.returncode == 0, out.stderr
    model.unlink()
    name = "tiny:1b-f32"
    gone = f"{name} is linked to {model}, which no longer exists (moved or deleted)"

    out = cli("list")  # says so, with what to do, and nothing on stderr
    assert out.returncode == 0 and out.stderr == ""
    assert re.search(rf"^{re.escape(name)}\s+F32\s+.*\s{re.escape(str(model))} \(linked, FILE"
                     r" MISSING\)$", out.stdout, re.MULTILINE), out.stdout
    assert re.search(rf"^{re.escape(gone)}: put the file back, or `localinfer rm {name}` and"
                     " add it again", out.stdout, re.MULTILINE), out.stdout
    [entry] = json.loads(cli("list", "--json").stdout)
    assert entry["file_missing"] and entry["name"] == name
    out = cli("ps")  # commands that do not use it say nothing about it
    assert out.returncode == 0 and out.stderr == ""

    for args in (["run", "tiny:1b", "hi"], ["show", name]):  # using it names the path
        out = cli(*args)
        assert out.returncode == 3, (args, out.stderr)
        assert f"localinfer: model not found: {gone}" in one_line_error(out)

    out = cli("rm", "--yes", "tiny:1b")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"removed {name} (its file {model} was already gone)\n"
    assert json.loads(cli("list", "--json").stdout) == []


def test_show_template_prints_the_template_a_chat_uses(home, tmp_path):
    with_template = tmp_path / "with.gguf"
    with_template.write_bytes(ggufgen.tiny_model())
    # The same file with its template key renamed (same length): a file without a template.
    without = tmp_path / "without.gguf"
    without.write_bytes(ggufgen.tiny_model().replace(b"tokenizer.chat_template",
                                                     b"tokenizer.chat_templatX"))
    for path, name in ((with_template, "with:1b"), (without, "without:1b")):
        assert cli("add", str(path), "--link", "--name", name).returncode == 0

    out = cli("show", "with:1b", "--template")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "{{ messages[0]['content'] }}\n" and out.stderr == ""

    builtin = load_catalog().family_for("llama").chat_template  # the file's architecture
    out = cli("show", "without:1b", "--template")
    assert out.returncode == 0, out.stderr
    assert out.stdout == BUILTIN_TEMPLATES[builtin] + "\n"
    assert out.stderr == (f"# chat template of without:1b-f32: built-in {builtin!r} (the file"
                          " has none)\n")
    out = cli("show", "without:1b")
    assert f"Chat template: built-in {builtin!r} (the file has none); `--template` prints it." \
        in out.stdout
    assert "(+1 output layer, which --gpu-layers counts)" in out.stdout


def test_a_base_model_is_marked_in_list_and_show(home, tmp_path):
    store = ModelStore()
    path = store.file_for("gemma3:270m-q4_k_m")
    path.parent.mkdir(parents=True)
    path.write_bytes(ggufgen.tiny_model())
    store.register(name="gemma3:270m-q4_k_m", model="gemma3:270m", quant="Q4_K_M", path=path,
                   sha256=None, source="test")
    out = cli("list")
    assert f"{path} (base model)" in out.stdout
    assert "A base model continues text; it does not follow instructions." in out.stdout
    assert json.loads(cli("list", "--json").stdout)[0]["base_model"] is True
    out = cli("show", "gemma3:270m")
    assert "  kind            base model: continues text, does not follow instructions\n" in \
        out.stdout


def test_plan_takes_an_installed_models_own_name_and_a_preset(home, starter_path, tmp_path):
    """`plan` knew catalog names and paths only: a model added under a name of its own, and a
    preset over it, were "unknown" though list, show and run took them."""
    assert cli("add", str(starter_path), "--name", "mystarter:270m").returncode == 0
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM mystarter:270m\nSYSTEM Be brief.\n")
    assert cli("create", "mario", "-f", str(modelfile)).returncode == 0
    for name in ("mystarter:270m", "mystarter", "mystarter:270m-q4_k_m", "mario"):
        out = cli("plan", name, "--json")
        assert out.returncode == 0, (name, out.stderr)
        assert json.loads(out.stdout)["shown"] == ["mystarter:270m-q4_k_m"], name
    out = cli("plan", "nosuch:1b")
    assert out.returncode == 3 and "an installed model's name" in out.stderr
