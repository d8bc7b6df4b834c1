"""serve, ps and stop as a user runs them: `localinfer` in a subprocess, with no daemon, with
the daemon on the fake backend (in this process), and `serve` itself; and where the daemon's
socket goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.cli.common import duration
from localinfer.errors import DaemonError
from localinfer.instance import runtime_dir
from localinfer.paths import Paths


def cli(*args: str, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture(autouse=True)
def _no_daemon_address(monkeypatch):
    """Clients find the daemon through this test's home, never an outside address."""
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)


def test_stop_and_ps_without_a_daemon_say_so_and_succeed(home):
    for args, words in ((["stop"], "nothing to stop"), (["stop", "gemma3:270m"],
                                                         "nothing to unload"), (["ps"], "")):
        out = cli(*args)
        assert out.returncode == 0, (args, out.stderr)
        assert out.stdout.startswith("no daemon is running") and words in out.stdout, out.stdout
        assert out.stderr == ""
    assert json.loads(cli("ps", "--json").stdout) == {"running": False, "loaded": []}
    out = cli("ps", "--socket")  # a script wants a path: there is none
    assert out.returncode == 8 and out.stdout == ""
    assert out.stderr.strip() == ("localinfer: daemon not running: no daemon is running"
                                  " (`localinfer serve` starts one).")


@pytest.mark.parametrize("args,env,words", [
    (["serve", "--port", "70000"], {}, "must be a port from 1 to 65535"),
    (["serve", "--port", "-1"], {}, "must be a port from 1 to 65535"),
    (["serve", "--idle-exit", "-1"], {}, "--idle-exit: must be a number of seconds above 0"),
    (["serve", "--max-queue", "-1"], {}, "--max-queue: must be 0 or more"),
    (["serve", "--slots", "0"], {}, "--slots: must be at least 1"),
    (["ps"], {"LOCALINFER_HOST": "127.0.0.1:abc"}, "is not an address"),
    (["ps"], {"LOCALINFER_HOST": "notahost:99999"}, "is not an address"),
    (["ps"], {"LOCALINFER_HOST": "unix:"}, "names no socket"),
    (["list"], {"LOCALINFER_HOME": "/dev/null"}, "LOCALINFER_HOME is /dev/null, which is not a"
                                                 " directory"),
], ids=["port-high", "port-negative", "idle-exit", "max-queue", "slots", "host-port",
        "host-range", "host-unix", "home-file"])
def test_bad_addresses_and_numbers_are_usage_errors(home, args, env, words):
    """An out-of-range --port, a LOCALINFER_HOST with a bad port and a LOCALINFER_HOME that is
    a file were internal errors (exit 70) or accepted; --idle-exit -1 exited at once."""
    out = cli(*args, env=env)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "internal error" not in out.stderr, out.stderr


def test_ps_shows_where_the_daemon_listens_and_what_it_holds(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="hi")) as daemon:
        with daemon.uds() as http:
            assert http.post("/api/generate", json={"model": "fake:1b"}).status_code == 200
        out = cli("ps")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == (f"daemon (pid {os.getpid()}) on unix:{daemon.socket} and"
                            f" {daemon.url}")
        assert lines[1].split() == ["NAME", "SIZE", "MEMORY", "PROCESSOR", "CONTEXT", "SLOTS",
                                    "ACTIVE", "UNTIL"]
        assert "fake:1b-f16" in lines[2] and "100% CPU" in lines[2]
        assert lines[2].endswith(("5 minutes from now", "4 minutes from now")), lines[2]
        assert cli("ps", "--socket").stdout == f"{daemon.socket}\n"
        status = json.loads(cli("ps", "--json").stdout)
        assert status["running"] and status["socket"] == str(daemon.socket)
        assert [m["info"]["name"] for m in status["loaded"]] == ["fake:1b-f16"]


@pytest.mark.parametrize("seconds, words", [
    (0, "0 seconds"), (1, "1 second"), (1.4, "1 second"), (59, "59 seconds"),
    (60, "1 minute"), (89, "1 minute"), (300, "5 minutes"), (5400, "90 minutes"),
    (7200, "2 hours"), (3600 * 30, "30 hours"), (86400 * 3, "3 days"),
])
def test_durations_have_units_in_the_singular_or_plural(seconds, words):
    assert duration(seconds) == words


def test_serve_says_where_it_listens_and_ps_and_stop_find_it():
    # A short home: a Unix socket path has at most 107 bytes.
    home = Path(tempfile.mkdtemp(prefix="li-", dir="/tmp"))
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    env.pop("LOCALINFER_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        socket = home / "run" / "localinfer.sock"
        assert first.startswith(f"localinfer serve: listening on unix:{socket} and"
                                " http://127.0.0.1:"), (first, proc.stderr)
        assert cli("ps", "--socket", env=env).stdout == f"{socket}\n"
        out = cli("stop", env=env)
        assert out.returncode == 0 and f"stopped the daemon at unix:{socket}" in out.stdout
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_runtime_directory_is_made_private(tmp_path):
    # As platformdirs' fallback without XDG_RUNTIME_DIR: /tmp/runtime-<uid>/localinfer.
    path = tmp_path / "runtime-1000" / "localinfer"
    assert runtime_dir(_paths(path)) == path
    for directory in (path, path.parent):
        assert directory.stat().st_mode & 0o777 == 0o700
    path.chmod(0o755)  # ours but open (an older version, or by hand): made private again
    runtime_dir(_paths(path))
    assert path.stat().st_mode & 0o777 == 0o700


def test_a_runtime_directory_that_is_not_ours_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "run"
    link.symlink_to(target)
    with pytest.raises(DaemonError, match=r"run is a symbolic link: set XDG_RUNTIME_DIR"):
        runtime_dir(_paths(link))
    if os.geteuid() == 0:  # only root can give a directory to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, 4242)
        with pytest.raises(DaemonError, match=r"belongs to uid 4242, not to this user"):
            runtime_dir(_paths(theirs))
        with pytest.raises(DaemonError, match=r"theirs, which belongs to uid 4242"):
            runtime_dir(_paths(theirs / "localinfer"))


def _paths(runtime: Path) -> Paths:
    base = runtime.parent
    return Paths(config_dir=base / "c", data_dir=base / "d", cache_dir=base / "k",
                 runtime_dir=runtime)
