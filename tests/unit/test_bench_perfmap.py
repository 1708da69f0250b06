"""bench/perfmap.py: a perf map that puts numba's cached kernels at their loaded addresses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.perfmap import short_name

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def spread(x):
    for i in prange(x.shape[0]):
        x[i] = i * 2.0
    return x.sum()
"""

CHECK = """
import json, os, sys
from bench import perfmap
perfmap.capture()
import numpy as np
import probe
probe.spread(np.zeros(64))
perfmap.write_map()
cres = next(iter(probe.spread.overloads.values()))
lib = cres.library
print(json.dumps({
    "map": open(f"/tmp/perf-{os.getpid()}.map").read(),
    "wrapper": lib.get_pointer_to_function(cres.fndesc.llvm_cpython_wrapper_name),
}))
os.remove(f"/tmp/perf-{os.getpid()}.map")
"""


def test_short_names_of_numba_symbols() -> None:
    mangled = "_ZN10enginecore7kernels9attention16_paged_attentionB4v153B182c8tJTC_2fWQAliW1x"
    assert short_name(mangled) == "attention._paged_attention"
    wrapper = "_ZN7cpython10enginecore7kernels5layer10int_layersB2v1B40c8tJTIeFIjxB2IKSgI4Crv"
    assert short_name(wrapper) == "python wrapper of layer.int_layers"
    assert short_name("cfunc." + mangled) == "C wrapper of attention._paged_attention"
    assert short_name("NRT_decref") == "NRT_decref"


@pytest.mark.skipif(not (shutil.which("nm") and shutil.which("objdump")), reason="no binutils")
def test_a_cached_kernel_and_its_parallel_region_are_mapped_where_numba_loaded_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")  # fmt: skip
    run = [sys.executable, "-c"]
    # the first process compiles and writes numba's cache; the second loads it, as a server
    subprocess.run([*run, "import numpy, probe; probe.spread(numpy.zeros(64))"], env=env,
                   check=True, timeout=300)  # fmt: skip
    out = subprocess.run([*run, CHECK], env=env, check=True, timeout=300, capture_output=True,
                         text=True).stdout  # fmt: skip
    import json

    got = json.loads(out.strip().splitlines()[-1])
    entries = {}
    for line in got["map"].splitlines():
        addr, size, name = line.split(" ", 2)
        entries[name] = (int(addr, 16), int(size, 16))
    assert "probe.spread" in entries
    # a second exported function of the object sits at the address numba resolves for it
    assert entries["python wrapper of probe.spread"][0] == got["wrapper"]
    regions = [n for n in entries if n.startswith("probe.spread (parallel region")]
    assert regions == ["probe.spread (parallel region, in spread)"]
