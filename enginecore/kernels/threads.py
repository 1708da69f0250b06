"""How many threads the numba kernels use."""

import numba


def set_num_threads(n: int) -> None:
    """0 = every core numba sees."""
    numba.set_num_threads(n if n > 0 else numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
