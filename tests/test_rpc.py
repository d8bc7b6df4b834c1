"""RPC workers: the pure-Python probe of llama.cpp's RPC protocol (against a fake worker),
the planner's split as loaded, and on the real starter model two `localinfer worker` processes on
loopback: the split's greedy text, a worker killed mid-stream, a version refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import ggufgen
from localinfer import gguf
from localinfer.bench.editor_workload import start_worker
from localinfer.config import Config, load_config
from localinfer.errors import ConfigError, InvalidRequest, WorkerError, WorkerLost
from localinfer.hardware import rpc
from localinfer.hardware.profile import CPUInfo, HardwareProfile
from localinfer.loading import parse_layer_split, with_workers
from localinfer.protocol import model_info_from, model_info_json
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.fake import FakeBackend
from rpc_fake import FakeWorker

GIB = 1 << 30


# --- the protocol, against a fake worker ------------------------------------------------------
def test_endpoints_are_parsed_and_checked():
    assert rpc.parse_endpoints(" 10.0.0.2:50052, desk:1234,10.0.0.2:50052") == (
        "10.0.0.2:50052", "desk:1234")
    assert rpc.parse_endpoint("[::1]:7") == ("::1", 7)
    assert rpc.parse_endpoints(None) == ()
    for bad in ("desk", "desk:", ":50052", "desk:0", "desk:70000", "desk:x",
                "http://127.0.0.1:50052", "a b:1", "h/x:1"):  # the URL passed as a host
        with pytest.raises(ConfigError, match="HOST:PORT"):
            rpc.parse_endpoints(bad)


def test_the_rpc_tensor_is_llama_cpps_struct():
    header = rpc.rpc_tensor_bytes(buffer=0x1000, data=0x2000, n_bytes=64)
    assert len(header) == 296  # sizeof(rpc_tensor) in ggml-rpc.cpp
    assert header[12:20] == (0x1000).to_bytes(8, "little")  # buffer, after id and type
    assert header[20:24] == (16).to_bytes(4, "little")  # ne[0]: 16 floats


def test_a_worker_is_probed():
    worker = FakeWorker(devices=2, free=3 * GIB, total=4 * GIB)
    try:
        profile = rpc.probe_worker(worker.endpoint)
    finally:
        worker.close()
    assert profile.endpoint == worker.endpoint and profile.protocol == "7.0.0"
    assert [(d.name, d.memory_free_gib, d.memory_total_gib) for d in profile.devices] == [
        ("device 0", 3.0, 4.0), ("device 1", 3.0, 4.0)]
    # A stock rpc-server publishes nothing more: no names, no bandwidth, no host name.
    assert profile.devices[0].bandwidth_gbps == 0.0 and profile.name == ""
    assert profile.rtt_ms > 0 and profile.link_gbps > 0
    sends = rpc.THROUGHPUT_SENDS
    assert worker.bytes_set == sends * rpc.THROUGHPUT_BYTES
    assert worker.commands[0] == rpc.CMD_HELLO and rpc.CMD_FREE_BUFFER in worker.commands


@pytest.mark.parametrize("version", [(7, 0, 9), (7, 0, 0)])
def test_a_newer_patch_is_accepted(version):
    worker = FakeWorker(version)
    try:
        assert rpc.probe_worker(worker.endpoint, measure_link=False).protocol == \
            rpc.version_text(version)
    finally:
        worker.close()


@pytest.mark.parametrize("version, why", [((8, 0, 0), "major version differs"),
                                          ((6, 3, 1), "major version differs"),
                                          ((7, 1, 0), "minor version is newer")])
def test_another_protocol_version_is_refused(version, why):
    worker = FakeWorker(version)
    try:
        with pytest.raises(WorkerError) as caught:
            rpc.probe_worker(worker.endpoint)
    finally:
        worker.close()
    text = caught.value.one_line()
    assert caught.value.title == rpc.MISMATCH
    for part in (worker.endpoint, rpc.version_text(version), "7.0.0", why):
        assert part in text


def test_something_else_on_the_port_is_named():
    worker = FakeWorker(hello_size=2)
    try:
        with pytest.raises(WorkerError, match="not a llama.cpp RPC worker"):
            rpc.probe_worker(worker.endpoint)
    finally:
        worker.close()


def test_a_busy_worker_times_out_with_a_reason():
    worker = FakeWorker(busy=True)
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError, match="busy serving another client") as caught:
            rpc.RPCConnection(worker.endpoint, reply_timeout_s=0.3)
    finally:
        worker.close()
    assert caught.value.title == "worker busy"
    assert time.monotonic() - started < 5


def test_an_unreachable_worker_is_left_out_or_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"  # closed once this block ends
    with pytest.raises(WorkerError, match=f"cannot reach worker {endpoint}") as caught:
        rpc.probe_worker(endpoint)
    # A loopback worker is started on loopback (the advice exposed it with --host 0.0.0.0).
    assert "`localinfer worker --port" in caught.value.message
    assert rpc.probe_workers((endpoint,), skip_unreachable=True)[0] == []


def test_a_worker_whose_rpc_port_takes_no_connection_but_runs_is_busy_not_missing():
    # Its description port answers: another daemon holds it ("cannot reach ... start one").
    with socket.socket() as description:
        description.bind(("127.0.0.1", 0))
        description.listen()
        port = description.getsockname()[1] - 1
        with socket.socket() as probe_port:
            try:
                probe_port.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip("the port below the description's is taken here")
        with pytest.raises(WorkerError, match="runs .* but takes no connection") as caught:
            rpc.probe_worker(f"127.0.0.1:{port}")
    assert caught.value.title == "worker busy"


def test_a_localinfer_worker_publishes_names_and_bandwidth():
    from localinfer.rpc_worker import InfoServer, OfferedDevice, info_document

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        info_port = s.getsockname()[1]
    device = OfferedDevice("CPU", "AMD EPYC", "cpu", 3 * GIB, 4 * GIB, 17.5)
    InfoServer("127.0.0.1", info_port, info_document([device], info_port - 1))
    info = rpc.worker_info(f"127.0.0.1:{info_port - 1}")
    assert info is not None and info["devices"][0]["bandwidth_gbps"] == 17.5
    worker = FakeWorker()
    try:
        profile = rpc.probe_worker(worker.endpoint, measure_link=False,
                                   info=lambda endpoint: info)
    finally:
        worker.close()
    assert (profile.devices[0].name, profile.devices[0].bandwidth_gbps) == ("CPU", 17.5)
    assert profile.name == socket.gethostname()
    # It publishes this machine's tag: planned as this machine's cores (a worker in a network
    # namespace or at this machine's LAN address); another machine's tag, or none, is not.
    assert info["machine"] == rpc.machine_tag()
    assert profile.same_machine == bool(rpc.machine_tag())
    worker = FakeWorker()
    try:
        other = rpc.probe_worker(worker.endpoint, measure_link=False,
                                 info=lambda endpoint: {**info, "machine": "0123456789abcdef"})
    finally:
        worker.close()
    assert not other.same_machine
    with pytest.raises(ValueError):
        rpc.parse_worker_info({"devices": [{"name": "CPU", "bandwidth_gbps": -1}]})


def test_a_worker_offers_the_bandwidth_its_threads_reach():
    from types import SimpleNamespace

    from localinfer.rpc_worker import offered

    cpu = SimpleNamespace(name="CPU", kind="cpu", description="x86", memory_free=GIB,
                          memory_total=2 * GIB)
    hw = HardwareProfile(ram_total_gib=16, ram_available_gib=12,
                         cpu=CPUInfo("x86", physical_cores=4, logical_cores=8),
                         host_bandwidth_gbps=40, host_bandwidth_1core_gbps=15)
    assert offered([cpu], hw)[0].bandwidth_gbps == 40  # type: ignore[list-item]
    assert offered([cpu], hw, 1)[0].bandwidth_gbps == 15  # type: ignore[list-item]
    assert offered([cpu], hw, 2)[0].bandwidth_gbps == 30  # type: ignore[list-item]
    assert offered([cpu], hw, 4)[0].bandwidth_gbps == 40  # type: ignore[list-item]


def test_workers_come_from_the_config_and_environment(home):
    assert load_config(environ={"LOCALINFER_WORKERS": "10.0.0.2:50052,10.0.0.3:50052"}
                       ).workers == "10.0.0.2:50052,10.0.0.3:50052"
    assert Config().workers is None


# --- the split ------------------------------------------------------------------------------
HOST = HardwareProfile(ram_total_gib=16, ram_available_gib=12,
                       cpu=CPUInfo("x86", physical_cores=4, logical_cores=8),
                       host_bandwidth_gbps=40, host_bandwidth_1core_gbps=15)


def test_a_layer_split_is_read_or_refused_by_name():
    assert parse_layer_split("6,6,6") == [6, 6, 6]
    for bad in ("", "6,x", "6,-1"):
        with pytest.raises(InvalidRequest, match="layer_split"):
            parse_layer_split(bad)


def test_llama_cpps_layer_rule_is_followed():
    from localinfer.runtime.llama import layers_per_device

    assert layers_per_device(18, 9, (5.0, 4.0)) == [5, 4]
    assert layers_per_device(18, 12, (1.0, 1.0)) == [6, 6]
    assert sum(layers_per_device(18, -1, (1.0, 2.0, 3.0))) == 19
    assert layers_per_device(18, 0, (1.0,)) == [0]


def test_a_mismatched_worker_refuses_the_load_and_an_absent_one_is_left_out(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())
    header = gguf.read_header(path)
    worker = FakeWorker((8, 0, 0))
    try:
        with pytest.raises(WorkerError, match="speaks RPC protocol 8.0.0"):
            with_workers(LoadOptions(), header, (worker.endpoint,), hardware=HOST,
                         config=Config())
    finally:
        worker.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    assert with_workers(LoadOptions(), header, (gone,), hardware=HOST,
                        config=Config()) == LoadOptions()


def test_the_load_takes_the_planners_split_or_the_one_given(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())
    header = gguf.read_header(path)  # 2 layers
    worker = FakeWorker(devices=2, free=3 * GIB, total=4 * GIB)
    try:
        endpoints = (worker.endpoint,)
        # A model this small reads faster on this machine than over any link: it stays.
        planned = with_workers(LoadOptions(n_ctx=256), header, endpoints, hardware=HOST,
                               config=Config())
        assert planned == LoadOptions(n_ctx=256)
        # Given: layer 0 here, layer 1 and the output head on the worker's first device (the
        # head counts as one layer in llama.cpp's n_gpu_layers and tensor_split), none on its
        # second; then one layer on each worker device, the head on the second.
        given = with_workers(LoadOptions(n_ctx=256), header, endpoints, hardware=HOST,
                             config=Config(layer_split="1,1,0"))
        assert (given.rpc_servers, given.n_gpu_layers, given.tensor_split) == \
            (endpoints, 2, (2.0,))
        given = with_workers(LoadOptions(n_ctx=256), header, endpoints, hardware=HOST,
                             config=Config(layer_split="0,1,1"))
        assert (given.n_gpu_layers, given.tensor_split) == (3, (1.0, 2.0))
        # A split written for devices that are not all there any more: the planner's, over
        # the ones that answer, still on the workers (the user asked for them).
        fallback = with_workers(LoadOptions(n_ctx=256), header, endpoints, hardware=HOST,
                                config=Config(layer_split="1,1"))
        assert fallback.rpc_servers == endpoints and fallback.n_gpu_layers >= 1
    finally:
        worker.close()


def test_a_split_over_a_worker_and_this_machines_gpu_loads_both(tmp_path):
    from dataclasses import replace

    from localinfer.hardware.profile import GPUInfo

    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())
    header = gguf.read_header(path)  # 2 layers
    gpu = GPUInfo(name="NVIDIA GeForce RTX 3060", vendor="nvidia", kind="discrete",
                  vram_total_gib=12, vram_free_gib=11, bandwidth_gbps=360)
    host = replace(HOST, gpus=(gpu,), backends=("CPU", "CUDA"))
    worker = FakeWorker(devices=1, free=3 * GIB, total=4 * GIB)
    try:
        # Layer 0 on the worker, layer 1 and the output head on this machine's GPU: the
        # GPU's weight is tensor_split's last, after the worker's device.
        given = with_workers(LoadOptions(n_ctx=256), header, (worker.endpoint,), hardware=host,
                             config=Config(layer_split="0,1,1"))
        assert (given.n_gpu_layers, given.tensor_split, given.local_gpu) == (3, (1.0, 2.0), True)
        alone = with_workers(LoadOptions(n_ctx=256), header, (worker.endpoint,), hardware=host,
                             config=Config(layer_split="1,1,0"))
        assert not alone.local_gpu  # the worker holds the last layer and the head
    finally:
        worker.close()


def test_only_this_machines_part_counts_against_its_memory(tmp_path):
    from localinfer.daemon.residency import MemoryPlan
    from localinfer.store import ResolvedModel

    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())
    model = ResolvedModel("tiny:1m-f32", path)
    worker = FakeWorker(devices=1, free=3 * GIB, total=4 * GIB)
    try:
        alone = MemoryPlan.for_machine(Config(ctx=256), HOST).estimate(model, None)
        pooled = MemoryPlan.for_machine(
            Config(ctx=256, workers=worker.endpoint, layer_split="0,2"), HOST
        ).estimate(model, None)
    finally:
        worker.close()
    # Both layers and the output head on the worker: this machine keeps the token embedding,
    # its compute buffer and the runtime, not the layers' weights and KV cache.
    assert pooled.n_gpu_layers == 3 and pooled.n_layers_total == 3
    assert 0 < pooled.ram_bytes < alone.ram_bytes


def test_a_load_that_fails_in_the_child_process_says_why(tmp_path):
    from localinfer.errors import ModelLoadError
    from localinfer.runtime.isolated import IsolatedBackend

    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())  # a header llama.cpp cannot load weights from
    with pytest.raises(ModelLoadError, match=f"llama.cpp could not load {path}"):
        IsolatedBackend(path, LoadOptions(n_ctx=64), name="tiny")


def test_a_model_whose_process_died_is_loaded_again(home):
    from daemon_util import fake_factory, install_fake_models, serve

    install_fake_models("fake:1b-f16")
    loads: list = []
    body = {"model": "fake:1b-f16", "prompt": "x", "stream": False}
    with serve(fake_factory(loads=loads, reply="hi")) as d, d.uds() as c:
        assert c.post("/api/generate", json=body).status_code == 200
        (entry,) = d.manager.loaded.values()
        # As runtime/isolated.py says once a call found its child process dead.
        entry.engine.backend.lost = WorkerLost("worker a:1 stopped responding")
        assert c.post("/api/generate", json=body).json()["response"] == "hi"
    assert len(loads) == 2


def test_the_split_crosses_the_wire():
    info = FakeBackend().info
    split = (("CPU", 7), ("127.0.0.1:50052 #0", 6))
    data = json.loads(json.dumps(model_info_json(info.__class__(**{**info.__dict__,
                                                                  "split": split}))))
    restored = model_info_from(data)
    assert restored is not None and restored.split == split


# --- two workers on loopback, the real model -------------------------------------------------
@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    home = tmp_path_factory.mktemp("worker-home")
    env = {**os.environ, "LOCALINFER_HOME": str(home),
           "PYTHONPATH": str(Path(__file__).parent.parent)}
    started = [start_worker(1, env) for _ in range(2)]
    yield started
    for proc, _ in started:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def same_kernels(monkeypatch):
    """llama.cpp's RPC server keeps weights in plain buffers, where this process repacks
    them for its CPU (another kernel, another rounding): both sides alike, for equal text."""
    monkeypatch.setenv("LOCALINFER_LLAMA_EXTRA_BUFTS", "0")


PROMPT = "Once upon a time, in a village by the sea,"


@pytest.mark.model
def test_the_split_over_two_workers_writes_the_local_text(two_workers, starter_path,
                                                          same_kernels):
    from localinfer.hardware.probe import probe
    from localinfer.loading import load_engine
    from localinfer.runtime.types import SamplingParams

    endpoints = tuple(endpoint for _, endpoint in two_workers)
    local = LoadOptions(n_ctx=512)
    # The planner keeps a model this small on one machine: the split is given.
    split = with_workers(local, gguf.read_header(starter_path), endpoints,
                         hardware=probe(measure_bandwidth=False),
                         config=Config(layer_split="6,6,6"))
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    texts = []
    for options in (split, local):
        with load_engine(starter_path, options, name="gemma3:270m",
                         family="gemma3").wait_ready() as engine:
            texts.append(engine.complete(PROMPT, greedy).result().text)
            if options.rpc_servers:
                layers = dict(engine.info.split)
                assert list(layers) == ["CPU", f"{endpoints[0]} #0", f"{endpoints[1]} #0"]
                assert list(layers.values()) == [6, 6, 7]  # the output head on the last
    assert texts[0] == texts[1] and len(texts[0]) > 20


@pytest.mark.model
def test_a_split_that_gives_the_last_worker_no_layers_loads(two_workers, starter_path,
                                                            same_kernels):
    # Its tensor_split named one share fewer than the workers' devices: the load was refused
    # (the planner's own split over two workers does this when one is not worth a layer).
    from localinfer.hardware.probe import probe
    from localinfer.loading import load_engine
    from localinfer.runtime.types import SamplingParams

    endpoints = tuple(endpoint for _, endpoint in two_workers)
    options = with_workers(LoadOptions(n_ctx=512), gguf.read_header(starter_path), endpoints,
                           hardware=probe(measure_bandwidth=False),
                           config=Config(layer_split="6,12,0"))
    with load_engine(starter_path, options, name="gemma3:270m",
                     family="gemma3").wait_ready() as engine:
        layers = dict(engine.info.split)
        assert layers["CPU"] == 6 and layers[f"{endpoints[0]} #0"] == 13  # with the output
        assert not layers.get(f"{endpoints[1]} #0")
        text = engine.complete(PROMPT, SamplingParams(temperature=0.0, max_tokens=8)).result()
    assert text.text


@pytest.mark.model
def test_a_worker_killed_mid_stream_ends_that_request_and_the_daemon_goes_on(
        two_workers, starter_path, same_kernels, tmp_path):
    from daemon_util import serve
    from localinfer.loading import engine_factory

    (_, kept), (victim, lost) = two_workers
    # With one worker gone, the split given for three devices no longer applies: the reload
    # takes the planner's over this machine and the worker left.
    config = Config(ctx=512, workers=f"{kept},{lost}", layer_split="6,6,6")
    with serve(engine_factory(config, n_slots=1)) as d, httpx.Client(
            transport=httpx.HTTPTransport(uds=str(d.socket)), base_url="http://localhost",
            timeout=120) as c:
        body = {"model": "gemma3:270m", "prompt": PROMPT, "stream": True,
                "options": {"temperature": 0, "num_predict": 400}}
        lines = []
        with c.stream("POST", "/api/generate", json=body) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 3:
                    victim.send_signal(signal.SIGKILL)
        error = lines[-1].get("error", "")
        assert f"worker {lost} stopped responding; the model was unloaded" in error
        assert kept not in error.split(";")[0]
        # The next request loads the model again, without the dead worker.
        again = c.post("/api/generate", json={**body, "stream": False,
                                              "options": {"num_predict": 4}})
        assert again.status_code == 200 and again.json()["response"]
        loaded = c.get("/localinfer/status").json()["loaded"]
        assert [device for device, _ in loaded[0]["info"]["split"]] == ["CPU", f"{kept} #0"]
    assert victim.wait(10) == -signal.SIGKILL


def test_serve_refuses_a_worker_of_another_protocol(home):
    worker = FakeWorker((8, 0, 0))
    try:
        done = subprocess.run([sys.executable, "-m", "localinfer", "serve", "--no-tcp",
                               "--workers", worker.endpoint],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LOCALINFER_HOME": str(home),
                                   "PYTHONPATH": str(Path(__file__).parent.parent)})
    finally:
        worker.close()
    assert done.returncode == WorkerError.exit_code, done.stderr
    assert f"worker {worker.endpoint} speaks RPC protocol 8.0.0" in done.stderr
    assert "Traceback" not in done.stderr



def test_one_worker_named_twice_is_refused(monkeypatch):
    # localhost:N and 127.0.0.1:N: llama.cpp connected twice and the load hung.
    same = {"devices": [], "machine": "abc123", "rpc_port": 18526}
    monkeypatch.setattr(rpc, "worker_info", lambda endpoint, **kw: dict(same))
    with pytest.raises(ConfigError, match="are the same worker"):
        rpc.probe_workers(("localhost:18526", "127.0.0.1:18526"))
