"""Benchmarks. The core's BLAS settings apply here too, before any benchmark imports numpy."""

from shared.config import prepare_blas_environment

prepare_blas_environment()
