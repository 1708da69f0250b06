"""How many threads the numba kernels use."""

from collections.abc import Iterator
from contextlib import contextmanager

import numba


def set_num_threads(n: int) -> None:
    """0 = every core numba sees."""
    numba.set_num_threads(n if n > 0 else numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


def count() -> int:
    """Threads the numba kernels use now (on this thread)."""
    return int(numba.get_num_threads())


@contextmanager
def limited(n: int) -> Iterator[None]:
    """At most n numba threads inside (on this thread), as many as before after."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, before))
    try:
        yield
    finally:
        numba.set_num_threads(before)
