"""Core processes shared per test module by the engine-core integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import TinyModels
from tests.fixtures.engine_cores import Reference, client_of, start
from tests.fixtures.processes import ProtocolClient, SpawnedCore


@pytest.fixture(scope="module")
def ref(tiny: TinyModels) -> Reference:
    return Reference(tiny.gguf_quant)


@pytest.fixture(scope="module")
def main_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    core = start(tmp_path_factory, tiny, "main")
    yield core
    core.stop()


@pytest.fixture(scope="module")
def spec_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    core = start(tmp_path_factory, tiny, "spec", speculative="prompt_lookup", prefix_cache="none")
    yield core
    core.stop()


@pytest.fixture(scope="module")
def small_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    """24 blocks of 4 tokens: four 48-token requests must preempt each other."""
    core = start(tmp_path_factory, tiny, "small", num_kv_blocks=24)
    yield core
    core.stop()


@pytest.fixture(scope="module")
def slow_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    """One sequence at a time, one waiting at most, slow steps, short queue deadline."""
    core = start(
        tmp_path_factory, tiny, "slow",
        max_num_seqs=1, queue_capacity=1, step_delay_ms=20, queue_deadline_ms=500,
    )  # fmt: skip
    yield core
    core.stop()


@pytest.fixture(scope="module")
def abort_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    core = start(tmp_path_factory, tiny, "abort", step_delay_ms=20, client_timeout_s=2.0)
    yield core
    core.stop()


@pytest.fixture
def main(main_core: SpawnedCore) -> ProtocolClient:
    return client_of(main_core)
