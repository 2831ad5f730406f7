"""Compute service: parameter bank, models, batched gradients, datasets. Knows no agents or events."""

from __future__ import annotations


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from netsim.errors import InputError

        raise InputError("run.device", "'cuda' requested but torch sees no CUDA device; use 'auto' or 'cpu'")
    return torch.device(name)


_ALLOCATOR_TUNED: bool | None = None  # the outcome of the one attempt


def tune_cpu_allocator() -> bool:
    """Keep freed memory in the process (glibc ``mallopt``): batched gradients allocate MB-sized
    temporaries every flush, and glibc's defaults hand them back to the OS and page-fault them in again,
    which measured 2-3x slower on the logistic and MLP paths. Blocks over mmap's largest threshold (32 MiB: a
    1,000-agent batch of an MNIST MLP's rows is 204 MB) come from the heap too, not from fresh mappings: both
    engines ran mnist_mlp and dfedsam_cheapest at 1,000 agents ~1.7x faster (peak memory +1-20%).
    Process-wide, once; a no-op off glibc."""
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED is None:
        _ALLOCATOR_TUNED = _mallopt()
    return _ALLOCATOR_TUNED


def _mallopt() -> bool:
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
        ok = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(M_MMAP_MAX, 0)
        return bool(ok and libc.mallopt(M_TRIM_THRESHOLD, 512 << 20))
    except (OSError, AttributeError):
        return False
