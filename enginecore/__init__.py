"""The engine core: token ids in, token ids out; the model, scheduler and KV cache live here."""

from shared.config import prepare_blas_environment

prepare_blas_environment()  # before anything in the core imports numpy
