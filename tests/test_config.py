"""Paths, config.toml and environment overrides."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localinfer.config import Config, load_config
from localinfer.errors import ConfigError
from localinfer.paths import get_paths


def test_home_moves_every_directory(home):
    p = get_paths()
    for d in (p.config_dir, p.data_dir, p.cache_dir, p.runtime_dir):
        assert d.is_relative_to(home)
    assert p.models_dir == p.data_dir / "models"


def test_nothing_is_created_at_import(tmp_path):
    env = {**os.environ, "LOCALINFER_HOME": str(tmp_path / "h")}
    code = ("import localinfer.cli, localinfer.store, localinfer.config, localinfer.gguf,"
            " localinfer.runtime.engine, localinfer.catalog; localinfer.config.load_config()")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert not (tmp_path / "h").exists()


def test_defaults_without_a_file(home):
    assert load_config(environ={}) == Config()


def test_file_then_environment(home):
    paths = get_paths()
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text('ctx = 8192\nthreads = 3\ndefault_model = "gemma3:1b"\n')
    config = load_config(environ={"LOCALINFER_THREADS": "5", "HF_HUB_OFFLINE": "1"})
    assert (config.ctx, config.threads, config.default_model) == (8192, 5, "gemma3:1b")
    assert config.offline


@pytest.mark.parametrize("text, words", [
    ("ctx = 'big'", ["ctx must be int"]),
    ("color = 1", ["unknown setting 'color'"]),
    ("ctx = [", ["cannot be read"]),
    ("ctx = " + "[" * 100_000, ["cannot be read", "too deeply"]),
    ("port = -1", ["port must be positive"]),
    ('flash_attn = "yes"', ['flash_attn must be "auto", "on" or "off"']),
    ('kv_type = "q4_1"', ["kv_type: unknown KV cache type 'q4_1'", "f16, q8_0, q4_0"]),
    ('kv_type = "q8_0,q4_0,f16"', ["K,V (e.g. q8_0,q4_0)"]),
    ('[models."a:1b"]\ncolour = 1', ["[models.\"a:1b\"]", "unknown setting 'colour'",
                                      "known: ctx, kv_type, temperature"]),
    ('[models."a:1b"]\nctx = 0', ["ctx must be positive"]),
    ('[models."a:1b"]\nkv_type = "q5_1"', ["unknown KV cache type 'q5_1'"]),
    ('[models."a:1b"]\ntemperature = -1', ["temperature must be a number of 0 or more"]),
    ('[models."a:1b"]\ntemperature = nan', ["temperature must be a number of 0 or more"]),
    ('[models."a:1b"]\ntop_p = inf', ["top_p must be a number of 0 or more"]),
    ("gpu_layers = -2", ["gpu_layers must be -1 (all) or 0 or more"]),
    ('[models."a:1b"]\ntop_k = 0.5', ["top_k must be int"]),
    ("models = 3", ["models must be tables"]),
    ('[models]\n"a:1b" = 3', ["must be a table of settings"]),
])
def test_bad_config_file(home, text, words):
    paths = get_paths()
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(environ={})
    for word in words:
        assert word in str(info.value)
    assert str(paths.config_file) in str(info.value)


def test_bad_environment_value_names_the_variable(home):
    with pytest.raises(ConfigError, match="LOCALINFER_CTX"):
        load_config(environ={"LOCALINFER_CTX": "lots"})


@pytest.mark.parametrize("word, value", [("1", True), ("yes", True), ("ON", True),
                                         ("true", True), ("0", False), ("off", False)])
def test_yes_no_settings_from_the_environment_take_the_usual_words(home, word, value):
    # As HF_HUB_OFFLINE=1 is written (LOCALINFER_OFFLINE=1 was "must be bool").
    assert load_config(environ={"LOCALINFER_OFFLINE": word}).offline is value


def test_a_yes_no_setting_that_is_neither_says_what_it_takes(home):
    with pytest.raises(ConfigError, match="LOCALINFER_OFFLINE.*1 or 0, yes or no"):
        load_config(environ={"LOCALINFER_OFFLINE": "maybe"})


@pytest.mark.parametrize("key", ["0x1F", "1e3", "+42", "true", "1979-05-27"])
def test_string_settings_from_the_environment_are_taken_as_written(home, key):
    config = load_config(environ={"LOCALINFER_API_KEY": key, "LOCALINFER_DEFAULT_MODEL": key})
    assert config.api_key == key and config.default_model == key


def test_a_runtime_dir_owned_by_another_user_falls_back_to_a_private_one(monkeypatch):
    import platformdirs

    from localinfer.paths import get_paths

    def refuse(self):
        raise PermissionError("/tmp/runtime-0 is owned by another user")

    monkeypatch.delenv("LOCALINFER_HOME", raising=False)
    monkeypatch.setattr(platformdirs.PlatformDirs, "user_runtime_dir", property(refuse))
    paths = get_paths()
    assert paths.runtime_dir == paths.cache_dir / "run"


def test_per_model_settings(home):
    paths = get_paths()
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text(
        'kv_type = "f16"\nctx = 4096\n'
        '[models."Qwen3:8b"]\nctx = 16384\nkv_type = "q8_0"\ntemperature = 0.6\ntop_p = 0.95\n'
        'top_k = 20\nmin_p = 0\nrepeat_penalty = 1.1\n'
        '[models."gemma3:270m-q4_k_m"]\ntemperature = 1\n')
    config = load_config(environ={})
    qwen = config.model_settings("qwen3:8b-q4_k_m", "qwen3:8b")  # found without the quant
    assert qwen is not None and qwen.ctx == 16384 and qwen.kv_type == "q8_0"
    assert qwen.sampling() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0,
                               "repeat_penalty": 1.1}
    # Its ctx and kv_type replace the global ones for it only; another model keeps those.
    mine = config.for_model("qwen3:8b-q4_k_m", "qwen3:8b")
    assert (mine.ctx, mine.kv_type) == (16384, "q8_0")
    assert config.for_model("llama3.1:8b") == config
    gemma = config.for_model("gemma3:270m-q4_k_m", "gemma3:270m")  # no ctx of its own
    assert (gemma.ctx, gemma.kv_type) == (4096, "f16")
    assert config.model_settings("gemma3:270m") is None  # the key names the quant


def test_keep_alive_takes_a_duration_as_the_flag_does(home):
    """--keep-alive 5m (the documented default's form) was refused in config.toml and the
    environment: "keep_alive must be float"."""
    assert load_config(environ={"LOCALINFER_KEEP_ALIVE": "5m"}).keep_alive == 300.0
    assert load_config(environ={"LOCALINFER_KEEP_ALIVE": "1h30m"}).keep_alive == 5400.0
    assert load_config(environ={"LOCALINFER_KEEP_ALIVE": "-1"}).keep_alive == -1.0
    (get_paths().config_dir).mkdir(parents=True, exist_ok=True)
    (get_paths().config_dir / "config.toml").write_text('keep_alive = "10m"\n')
    assert load_config(environ={}).keep_alive == 600.0
    with pytest.raises(ConfigError, match='a duration such as "5m"'):
        load_config(environ={"LOCALINFER_KEEP_ALIVE": "5x"})
    # As a request's keep_alive: past a year or infinite is forever, NaN is refused.
    assert load_config(environ={"LOCALINFER_KEEP_ALIVE": "inf"}).keep_alive == -1.0
    assert load_config(environ={"LOCALINFER_KEEP_ALIVE": "99999999h"}).keep_alive == -1.0
    with pytest.raises(ConfigError, match="keep_alive must be seconds"):
        load_config(environ={"LOCALINFER_KEEP_ALIVE": "nan"})


def test_min_tps_is_checked_where_it_is_set(home):
    """min_tps = -2 was found only by `plan`, with no file named."""
    with pytest.raises(ConfigError, match="LOCALINFER_MIN_TPS: min_tps must be 0 or more"):
        load_config(environ={"LOCALINFER_MIN_TPS": "-2"})
