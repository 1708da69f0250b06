"""deploy/k8s-split: the keyed multi-host layout agrees with the config schema and itself
(key paths inside the mounted Secrets, the frontends' core_address = the core's Service)."""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from shared.config import EngineConfig, load
from shared.core_link import check_protected

SPLIT = Path(__file__).resolve().parents[2] / "deploy" / "k8s-split"


def docs() -> list[dict[str, Any]]:
    return [d for p in sorted(SPLIT.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def config(key: str, tmp: Path) -> EngineConfig:
    text = one("ConfigMap", "tl-serve-split-config")["data"][key]
    tomllib.loads(text)
    (tmp / key).write_text(text)
    return load(tmp / key, {}).engine


def mounted_files(deployment: str) -> dict[str, str]:
    """Path inside the container -> the key of its ConfigMap or Secret item."""
    spec = one("Deployment", deployment)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    files = {}
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]]
        items = (source.get("secret") or source.get("configMap"))["items"]
        for item in items:
            files[str(PurePosixPath(mount["mountPath"]) / item["path"])] = item["key"]
    return files


def test_the_core_binds_a_reachable_address_with_its_keys_mounted(tmp_path: Path) -> None:
    core = config("core.toml", tmp_path)
    files = mounted_files("tl-serve-core")
    assert files[core.curve_core_key] == "core.key_secret"
    authorized = [p for p, key in files.items() if p.startswith(core.curve_authorized_keys + "/")]
    assert authorized and all(files[p].endswith(".key") for p in authorized)
    check_protected(core.resolved_core_address, core.curve_keys, "core")  # keys present
    (container,) = one("Deployment", "tl-serve-core")["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["tl-enginecore", "--config"]
    assert container["command"][2] in files


def test_frontends_attach_to_the_core_service_with_their_own_keys(tmp_path: Path) -> None:
    frontend = config("frontend.toml", tmp_path)
    assert not frontend.spawn_core
    files = mounted_files("tl-serve-frontend")
    assert files[frontend.curve_core_key] == "core.key"  # the public one only
    assert files[frontend.curve_frontend_key] == "frontend.key_secret"
    assert not any("core.key_secret" in key for key in files.values())
    service = one("Service", "tl-serve-core")
    port = service["spec"]["ports"][0]["port"]
    assert frontend.core_address == f"tcp://{service['metadata']['name']}:{port}"
    core = config("core.toml", tmp_path)
    assert core.core_address.endswith(f":{port}")
    assert frontend.model_dir == core.model_dir  # same tokenizer and template as the core
