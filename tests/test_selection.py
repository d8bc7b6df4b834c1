"""Choosing models (selection.py): the planner's preferences from the settings, and one
meaning of "the best variant, else the smallest" for `plan`, `pull` and the models list."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from localinfer.catalog import load_catalog
from localinfer.cli import main
from localinfer.config import Config
from localinfer.hardware import load_profile
from localinfer.planner import Candidate, PlanPrefs, plan
from localinfer.selection import best_or_smallest, plan_prefs, pull_target
from localinfer.store import ModelStore

PROFILES = Path(__file__).parent / "profiles"
PACKAGE = Path(__file__).resolve().parent.parent / "localinfer"
CATALOG = load_catalog()


def candidate(name: str) -> Candidate:
    spec, variant = CATALOG.lookup(name)
    assert variant is not None
    return Candidate.from_spec(spec, variant)


# --- preferences ---------------------------------------------------------------------------------
def test_prefs_come_from_the_settings_kv_cache_type_included():
    config = Config(ctx=8192, min_tps=5.0, gpu_layers=12, threads=3, kv_type="q8_0")
    prefs = plan_prefs(config, {"CPU": 0.8}, n_slots=None)
    assert (prefs.n_ctx, prefs.min_tps, prefs.n_slots, prefs.n_gpu_layers, prefs.n_threads,
            prefs.kv_type) == (8192, 5.0, None, 12, 3, "q8_0")
    assert prefs.calibration == {"CPU": 0.8}
    assert plan_prefs(Config()) == PlanPrefs()  # the defaults agree


def test_the_kv_cache_type_changes_the_plan():
    # A q8_0 cache takes half the memory of an f16 one: a context that does not fit, fits.
    hw = load_profile(PROFILES / "laptop-8gb-cpu.json")
    c = candidate("qwen3:0.6b-q8_0")
    f16 = plan(hw, [c], plan_prefs(Config(ctx=32768))).evaluations[0]
    q8 = plan(hw, [c], plan_prefs(Config(ctx=32768, kv_type="q8_0"))).evaluations[0]
    assert not f16.fits and q8.fits
    assert q8.host.kv_bytes < f16.host.kv_bytes


def test_only_selection_builds_prefs_from_settings():
    """PlanPrefs(...) is written in the planner (its defaults) and in selection.py only."""
    builders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "PlanPrefs":
                builders.append(str(path.relative_to(PACKAGE)))
    assert set(builders) <= {"planner/__init__.py", "planner/machine.py", "planner/speed.py",
                             "planner/placement.py", "selection.py"}, builders


# --- the best variant, else the smallest ---------------------------------------------------------
def test_the_smallest_is_the_smallest_file():
    # At 32k tokens neither fits an 8 GB laptop. The 4B at Q2_K is the smaller file, the 1.7B
    # at Q8_0 needs less memory (its KV cache has fewer layers): the smallest is the file.
    hw = load_profile(PROFILES / "laptop-8gb-cpu.json")
    result = plan(hw, [candidate("qwen3:4b-q2_k"), candidate("qwen3:1.7b-q8_0")],
                  plan_prefs(Config(ctx=32768)))
    four, one7 = result.evaluations
    assert result.choice is None
    assert four.candidate.file_bytes < one7.candidate.file_bytes
    assert four.host.total_bytes > one7.host.total_bytes
    assert best_or_smallest(result).candidate.name == "qwen3:4b-q2_k"
    assert "the smallest, qwen3:4b-q2_k," in result.summary


def test_the_best_is_the_planners_choice():
    hw = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    result = plan(hw, [candidate("qwen3:1.7b-q4_k_m"), candidate("qwen3:1.7b-q8_0")],
                  PlanPrefs())
    assert best_or_smallest(result) is result.choice


@pytest.mark.parametrize("profile, settings, fits", [
    # Nothing reaches the target speed: both take the fastest that fits (with a q8_0 cache).
    ("raspberry-pi5-8gb", {"LOCALINFER_MIN_TPS": "1000", "LOCALINFER_KV_TYPE": "q8_0"}, True),
    # Nothing fits: both take the smallest file.
    ("laptop-8gb-cpu", {"LOCALINFER_CTX": "40960"}, False),
])
def test_plan_and_pull_choose_the_same_variant(home, monkeypatch, capsys, profile, settings,
                                               fits):
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    path = PROFILES / f"{profile}.json"
    assert main(["--offline", "plan", "qwen3", "--hardware", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert (planned["choice"] is not None) == fits
    if fits:
        assert "nothing reaches 1000 tok/s" in planned["summary"]
        planned_name = planned["choice"]["name"]
    else:
        match = re.search(r"nothing fits: the smallest, (\S+),", planned["summary"])
        assert match is not None, planned["summary"]
        planned_name = match[1]
    target = pull_target(ModelStore(), "qwen3", hardware=load_profile(path))
    assert target.name == planned_name and target.planned
    assert target.reason.startswith(planned["summary"])
