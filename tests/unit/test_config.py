"""runtime.toml: [engine] keys, defaults, TL_ENGINE__ overrides, refused keys and values."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import Config, ConfigError, EngineConfig, load, parse_listen
from shared.core_link import runtime_dir

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "runtime.toml"
    p.write_text(text)
    return p


def test_defaults_without_a_file() -> None:
    cfg = load(None, {}).engine
    assert cfg == EngineConfig()
    assert cfg.http_listen == ":8000"
    assert cfg.health_listen == ":9464"
    assert cfg.prefix_cache == "radix"
    assert cfg.model_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_annotated_deploy_config_is_exactly_the_defaults() -> None:
    assert load(ROOT / "deploy" / "runtime.toml", {}) == Config()


def test_keys_from_the_file(tmp_path: Path) -> None:
    text = '[engine]\nmodel_dir = "/m"\nhttp_listen = "127.0.0.1:8001"\nprefill_chunk = 512\nprefix_cache = "none"\n'
    cfg = load(write(tmp_path, text), {}).engine
    assert (cfg.model_dir, cfg.prefill_chunk, cfg.prefix_cache) == ("/m", 512, "none")
    assert parse_listen(cfg.http_listen) == ("127.0.0.1", 8001)
    assert cfg.served_model_id == "m"


@pytest.mark.parametrize(
    ("env", "key", "value"),
    [
        ({"TL_ENGINE__QUEUE_CAPACITY": "3"}, "queue_capacity", 3),
        ({"TL_ENGINE__MODEL_ID": "smol"}, "model_id", "smol"),  # not a TOML literal: a string
        ({"TL_ENGINE__MODEL_ID": '"quoted"'}, "model_id", "quoted"),
        (
            {"TL_ENGINE__SPAWN_CORE": "false", "TL_ENGINE__CORE_ADDRESS": "tcp://127.0.0.1:5555"},
            "spawn_core",
            False,
        ),
        ({"TL_ENGINE__DRAIN_TIMEOUT_S": "2.5"}, "drain_timeout_s", 2.5),
        ({"TL_ENGINE__API_KEYS": '["a", "b"]'}, "api_keys", ("a", "b")),
        ({"TL_ENGINE__SPECULATIVE": "prompt_lookup"}, "speculative", "prompt_lookup"),
    ],
)
def test_env_overrides(tmp_path: Path, env: dict[str, str], key: str, value: object) -> None:
    path = write(tmp_path, "[engine]\nqueue_capacity = 9\nmodel_id = 'file'\n")
    assert getattr(load(path, env).engine, key) == value


def test_env_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine]\nqueue_capacity = 9\n")
    assert load(path, {"TL_ENGINE__QUEUE_CAPACITY": "4"}).engine.queue_capacity == 4
    assert load(path, {"OTHER": "1"}).engine.queue_capacity == 9


@pytest.mark.parametrize(
    ("text", "env", "names"),
    [
        ("[engine]\nqueue_capcity = 3\n", {}, "queue_capcity"),
        ("[engine]\n", {"TL_ENGINE__NOPE": "1"}, "nope"),
        ("[server]\nport = 1\n", {}, "server"),
        ("[engine]\nqueue_capacity = 0\n", {}, "queue_capacity"),
        ("[engine]\nqueue_capacity = 'many'\n", {}, "engine.queue_capacity"),
        ("[engine]\nprefix_cache = 'lru'\n", {}, "engine.prefix_cache"),
        ("[engine]\nhttp_listen = '8000'\n", {}, "http_listen"),
        ("[engine]\nblock_size = 12\n", {}, "block_size"),
        ("[engine]\nspawn_core = false\n", {}, "core_address"),
        ("[engine]\n", {"TL_ENGINE__MAX_NUM_SEQS": "-1"}, "max_num_seqs"),
        ("[engine\n", {}, "runtime.toml"),
    ],
)
def test_bad_keys_and_values_are_refused_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], names: str
) -> None:
    with pytest.raises(ConfigError, match=names):
        load(write(tmp_path, text), env)


def test_core_address_defaults_to_an_ipc_socket_named_by_the_port() -> None:
    cfg = load(None, {"TL_ENGINE__HTTP_LISTEN": ":8123"}).engine
    assert cfg.resolved_core_address.startswith("ipc://")
    assert cfg.resolved_core_address == f"ipc://{runtime_dir() / 'core-8123.sock'}"


def test_the_readme_table_names_every_key() -> None:
    section = (ROOT / "README.md").read_text().split("\n## Configuration\n", 1)[1]
    table = section.split("\n## ", 1)[0]
    named = {
        key
        for row in table.splitlines()
        if row.startswith("| `")
        for key in row.split("|")[1].replace("`", "").replace(",", " ").split()
    }
    assert named == set(EngineConfig.__struct_fields__)


def test_served_model_names_and_chat_template() -> None:
    cfg = load(None, {"TL_ENGINE__SERVED_MODEL_NAME": '["a", "org/b"]'}).engine
    assert (cfg.served_model_id, cfg.served_model_ids) == ("a", ("a", "org/b"))
    assert load(None, {"TL_ENGINE__MODEL_ID": "m"}).engine.served_model_ids == ("m",)
    for env in (
        {"TL_ENGINE__SERVED_MODEL_NAME": '["a"]', "TL_ENGINE__MODEL_ID": "m"},
        {"TL_ENGINE__SERVED_MODEL_NAME": '["a", "a"]'},
        {"TL_ENGINE__SSE_PING_INTERVAL_S": "0"},
    ):
        with pytest.raises(ConfigError):
            load(None, env)
