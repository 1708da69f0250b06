"""bench.ab's base side: a revision's enginecore/ importable beside the checkout's."""

from __future__ import annotations

import os
import re

import numba

from bench import ab


def test_a_revision_imports_as_enginecore_base_and_never_reaches_the_checkouts() -> None:
    root = ab.base_package("HEAD")
    files = list((root / ab.BASE).rglob("*.py"))
    assert files, "no package extracted"
    for path in files:  # every import is renamed: no module of the base loads the checkout's
        assert not re.search(r"^\s*(from|import) enginecore\b", path.read_text(), re.M), path
    env, config = os.environ.get("NUMBA_CACHE_DIR"), numba.config.CACHE_DIR  # type: ignore[attr-defined]
    mods = ab.sides("HEAD", "kernels.threads")
    # the base keys numba's cache folder on its own source; this process keeps its own
    assert (os.environ.get("NUMBA_CACHE_DIR"), numba.config.CACHE_DIR) == (env, config)  # type: ignore[attr-defined]
    assert mods["base"].__name__ == "enginecore_base.kernels.threads"
    assert mods["new"].__name__ == "enginecore.kernels.threads"
    assert mods["base"] is not mods["new"]
    assert ab.base_package("HEAD") == root  # made once
