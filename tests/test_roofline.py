"""Bytes read per decoded token and the roofline (planner/speed.py): one formula for the plan, the
prediction and the chat UI's ceiling, with the KV cache type honoured (q8_0 stores 34 bytes per
32 elements, F16 2 bytes per element)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.catalog import load_catalog
from localinfer.errors import InvalidRequest
from localinfer.hardware import load_profile
from localinfer.planner import (
    Candidate,
    PlanPrefs,
    decode_bytes_per_token,
    decode_reads,
    kv_bytes_per_element,
    plan,
    predict,
    roofline_for,
)
from localinfer.planner.calibration import ReplyCheck, after_reply
from localinfer.protocol import ModelInfo
from localinfer.runtime.types import Done, Timings, Usage

PROFILES = Path(__file__).parent / "profiles"
CATALOG = load_catalog()
Q8_0_SHARE = 17 / 32
"""A q8_0 KV cache's size (or read) as a share of an F16 one: 34/32 over 2 bytes."""


def candidate(name: str) -> Candidate:
    spec, variant = CATALOG.lookup(name)
    return Candidate.from_spec(spec, variant or spec.variant())


def laptop():
    return load_profile(PROFILES / "laptop-8gb-cpu.json")


def info_for(c: Candidate, n_gpu_layers: int = 0, gpu_backend: str | None = None
             ) -> ModelInfo:
    return ModelInfo(name=c.name, path="/nonexistent.gguf", architecture="llama",
                     quant=c.quant, size_bytes=c.file_bytes, n_params=c.params,
                     n_layers=c.n_layers, n_gpu_layers=n_gpu_layers, n_ctx_train=8192,
                     n_ctx=8192, n_slots=1, n_vocab=c.n_vocab, gpu_backend=gpu_backend)


def kv_part(reads, position: int) -> float:
    cpu, gpu = reads.bytes_at(position)
    return cpu + gpu - reads.cpu_weight_bytes - reads.gpu_weight_bytes


def test_kv_bytes_per_element_by_cache_type():
    assert kv_bytes_per_element("f16") == 2.0
    assert kv_bytes_per_element("q8_0") == 34 / 32
    assert kv_bytes_per_element("q4_0") == 18 / 32
    # K and V of their own types (llama-server's -ctk/-ctv): as many elements each.
    assert kv_bytes_per_element("q8_0,q4_0") == (34 / 32 + 18 / 32) / 2
    assert kv_bytes_per_element("f16, q8_0") == (2.0 + 34 / 32) / 2
    for bad in ("q5_1", "q8_0,q4_0,f16", "q8_0,", ""):
        with pytest.raises(InvalidRequest, match="unknown KV cache type"):
            kv_bytes_per_element(bad)


def test_a_q8_0_cache_reads_17_32nds_of_the_f16_bytes_and_the_same_weights():
    c = candidate("llama3.1:8b-q4_k_m")
    f16, q8 = decode_reads(c, 0, "f16"), decode_reads(c, 0, "q8_0")
    assert q8.cpu_weight_bytes == f16.cpu_weight_bytes > 0
    assert kv_part(f16, 4096) > 0
    assert kv_part(q8, 4096) == kv_part(f16, 4096) * Q8_0_SHARE
    assert decode_bytes_per_token(c, 0, "q8_0") == decode_bytes_per_token(c, 0)
    assert decode_bytes_per_token(c, 4096, "q8_0") == q8.cpu_weight_bytes + kv_part(q8, 4096)


def test_a_sliding_window_layer_reads_at_most_its_window():
    c = candidate("gemma3:4b-q4_k_m")
    windows = [layer.sliding_window for layer in c.layers]
    assert any(windows) and not all(windows)
    reads = decode_reads(c, 0, "q8_0")
    far = 10 * max(w for w in windows if w)
    per_position_global = sum(layer.kv_elements_per_token * 34 / 32 for layer in c.layers
                              if layer.sliding_window is None)
    assert kv_part(reads, far + 1) - kv_part(reads, far) == pytest.approx(per_position_global)


def test_the_layers_split_between_the_devices_as_llama_cpp_offloads_them():
    c = candidate("llama3.1:8b-q4_k_m")
    everything = decode_reads(c, 0, "f16")
    last_ten = decode_reads(c, 10, "f16")
    assert len(last_ten.gpu_kv) == 10 and len(last_ten.cpu_kv) == c.n_layers - 10
    assert last_ten.cpu_weight_bytes + last_ten.gpu_weight_bytes == everything.cpu_weight_bytes
    assert last_ten.gpu_weight_bytes == sum(layer.read_bytes for layer in c.layers[-10:])
    all_on_gpu = decode_reads(c, c.n_layers + 1, "f16")  # + 1: the output head too
    assert all_on_gpu.cpu_weight_bytes == 0 and not all_on_gpu.cpu_kv


def test_the_roofline_of_a_loaded_model_honours_its_kv_cache_type():
    c = candidate("llama3.1:8b-q4_k_m")
    hw = laptop()
    f16 = roofline_for(info_for(c), hw, c, "f16")
    q8 = roofline_for(info_for(c), hw, c, "q8_0")
    assert f16.exact and hw.host_bandwidth_gbps > 0
    for kv_type, roofline in (("f16", f16), ("q8_0", q8)):
        assert roofline.ceiling_tps(4096) == pytest.approx(
            hw.host_bandwidth_gbps * 1e9 / decode_bytes_per_token(c, 4096, kv_type))
    assert q8.ceiling_tps(0) == f16.ceiling_tps(0)
    assert q8.ceiling_tps(8192) > f16.ceiling_tps(8192)
    assert q8.percent(5.0, 8192) < f16.percent(5.0, 8192)


def test_without_a_header_the_roofline_is_the_whole_file_per_token():
    c = candidate("llama3.1:8b-q4_k_m")
    roofline = roofline_for(info_for(c), laptop(), None, "q8_0")
    assert not roofline.exact
    assert roofline.reads.bytes_at(8192) == (c.file_bytes, 0.0)
    gpu = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    on_gpu = roofline_for(info_for(c, c.n_layers + 1, "CUDA"), gpu, None, "f16")
    assert on_gpu.reads.bytes_at(8192) == (0.0, c.file_bytes)
    assert on_gpu.gpu_bandwidth_gbps == gpu.gpus[0].bandwidth_gbps


def test_the_plan_sizes_and_predicts_a_q8_0_cache():
    c = candidate("llama3.1:8b-q4_k_m")
    hw = load_profile(PROFILES / "desktop-rtx4090-64gb.json")
    f16 = plan(hw, [c], PlanPrefs(n_ctx=32768)).evaluations[0]
    q8 = plan(hw, [c], PlanPrefs(n_ctx=32768, kv_type="q8_0")).evaluations[0]
    assert f16.gpu is not None and q8.gpu is not None
    assert q8.gpu.kv_bytes == pytest.approx(f16.gpu.kv_bytes * Q8_0_SHARE, rel=1e-6)
    assert q8.gpu.weights_bytes == f16.gpu.weights_bytes
    assert q8.decode_tps_full > f16.decode_tps_full
    assert predict(c, hw, q8.n_gpu_layers, position=32768, kv_type="q8_0").decode_tps == \
        pytest.approx(q8.decode_tps_full)


def test_an_unknown_kv_cache_type_is_refused_with_its_name():
    with pytest.raises(InvalidRequest, match="q4_1"):
        plan(laptop(), [candidate("llama3.2:1b-q8_0")], PlanPrefs(kv_type="q4_1"))


def test_the_plan_sizes_a_q4_0_cache_and_k_and_v_apart():
    c = candidate("llama3.1:8b-q4_k_m")
    hw = load_profile(PROFILES / "desktop-rtx4090-64gb.json")

    def kv(kv_type: str) -> int:
        gpu = plan(hw, [c], PlanPrefs(n_ctx=32768, kv_type=kv_type)).evaluations[0].gpu
        assert gpu is not None
        return gpu.kv_bytes

    f16 = kv("f16")
    assert kv("q4_0") == pytest.approx(f16 * (18 / 32) / 2, rel=1e-6)
    assert kv("q8_0,q4_0") == pytest.approx(f16 * (34 / 32 + 18 / 32) / 4, rel=1e-6)
    assert kv("q4_0") < kv("q8_0,q4_0") < kv("q8_0") < f16


def test_decode_steps_above_the_roofline_ask_for_the_bandwidth_measured_again():
    # The chat's check (after_reply with the roofline it showed): no recording, a decision.
    hw = laptop()

    def reply(accepted: int) -> Done:
        return Done("x", "length", Usage(10, 101), Timings(
            prompt_tokens=10, completion_tokens=101, decode_tokens=100, decode_ms=1000.0,
            drafted_tokens=2 * accepted, accepted_tokens=accepted))

    check = after_reply(reply(0), hardware=hw, roofline_pct=150.0)
    assert check.remeasure is not None and "150% of the roofline" in check.remeasure
    assert check.note is not None and check.note.endswith("measuring it again.")
    # With speculation a step makes its accepted drafts too: 150% x 50/100 steps is below it.
    assert after_reply(reply(50), hardware=hw, roofline_pct=150.0) == ReplyCheck()
    assert after_reply(reply(0), hardware=hw, roofline_pct=105.0) == ReplyCheck()
    assert after_reply(reply(0), hardware=hw, roofline_pct=None) == ReplyCheck()
