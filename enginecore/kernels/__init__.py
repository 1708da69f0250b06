"""Numba kernels of the forward pass.

The OpenMP threading layer comes first: its workers spin briefly between parallel regions,
which a decode step (hundreds of short regions) needs; numba's own workqueue layer sleeps
between regions and made a batch-1 decode step 5x slower (bench/README.md). Set here, before
any parallel kernel runs, rather than through NUMBA_THREADING_LAYER in the environment.
"""

import numba

numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]  # type: ignore[attr-defined]
