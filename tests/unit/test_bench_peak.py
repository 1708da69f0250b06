"""bench/peak.py: the multiply-add loop the compute-bound figures are set beside runs as many
iterations as asked, of the instructions each path's int16 kernels multiply with."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from llvmlite import binding as llvm

from bench import peak
from bench.isa import NEWER_THAN_AVX2
from enginecore.kernels import dot


@pytest.mark.skipif(dot.SELECTED == dot.Isa.PORTABLE, reason="no multiply-add loop to run")
def test_the_loop_runs_n_iterations_of_products_on_every_thread() -> None:
    # every product is 1 * 1 and the first accumulator takes one instruction an iteration:
    # its lanes hold 2 * n
    assert peak._one(1000) == 2000
    assert peak._one(12345) == 24690
    assert peak._all(1000, 2) == 4000
    assert peak.rate(2, seconds=0.01, repeat=1) > 0
    line, every = peak.peak()
    assert dot.SELECTED.name in line and every is not None and every > 0


def _features(drop: tuple[str, ...]) -> str:
    host = dict(llvm.get_host_cpu_features())
    return ",".join(("-" if k.startswith(drop) or not v else "+") + k for k, v in host.items())


PATHS = [
    (dot.Isa.AVX2, NEWER_THAN_AVX2),  # as bench/isa.py's avx2 ceiling turns them off
    (dot.Isa.AVX_VNNI, tuple(f for f in NEWER_THAN_AVX2 if f != "avxvnni")),
]


@pytest.mark.parametrize(("isa", "drop"), PATHS, ids=[isa.name for isa, _ in PATHS])
def test_the_older_paths_loops_as_a_process_told_their_cpu(
    isa: dot.Isa, drop: tuple[str, ...]
) -> None:
    if isa not in dot.supported() or isa == dot.SELECTED:
        pytest.skip(f"{isa.name}: not on this host, or the process's own path (above)")
    code = "from bench import peak; from enginecore.kernels import dot; print(dot.SELECTED.name, peak._one(777))"
    env = dict(os.environ, NUMBA_CPU_FEATURES=_features(drop))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [isa.name, "1554"]


def test_the_portable_path_has_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot, "SELECTED", dot.Isa.PORTABLE)
    assert peak.peak() == ("int16 multiply-add peak: none on the portable path", None)
