"""TRL's fused log-probabilities on the CPU, in tiles sized for the CPU (decision 145).

TRL 1.16 scores a batch's tokens against the whole vocabulary in tiles of up to 4,096 tokens by
`_CHUNKED_LOGPROB_CHUNK_SIZE` (32,768) columns (`trl/trainer/utils.py`), a width chosen for a GPU. On a
device without Triton it scores every position, prompt and padding included, with torch operations on
the whole tile, and each of them allocates a fresh fp32 tile: 324 MB for two sequences of 1,236 tokens.
glibc serves an allocation that large with `mmap`, so the kernel maps and zero-fills every page again at
every operation: a tiny model's training step spent most of its time there, and the pass peaked at
3.2 GB. In tiles of `COLUMNS` columns, and with glibc keeping freed tiles for the next one, the same
step takes half the time and the process a quarter of the memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator

import torch
import trl.trainer.utils as trl_utils

COLUMNS = 1024
"""Vocabulary columns per tile on the CPU: a tile of TRL's 4,096 tokens is then 16 MB in fp32."""

MMAP_THRESHOLD_BYTES = 32 << 20
"""Allocations from this size up are mapped for themselves: glibc's largest threshold, above any tile."""

TRIM_THRESHOLD_BYTES = 256 << 20
"""Free memory the heap keeps at its top rather than return to the kernel: the tiles one pass holds at once."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)


@contextlib.contextmanager
def cpu_logprob_tiles(device: torch.device) -> Iterator[None]:
    """While open, TRL's fused log-probabilities are computed `COLUMNS` vocabulary columns at a time when
    `device` is the CPU (elsewhere, TRL's width). The backward pass reuses the width its forward ran with."""
    if device.type != "cpu":
        yield
        return
    keep_freed_tiles()
    width = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
    trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = COLUMNS
    try:
        yield
    finally:
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = width


@functools.cache
def keep_freed_tiles() -> None:
    """Fixes glibc's thresholds for the rest of the process. Left to itself, glibc returns the top of its
    heap to the kernel as soon as more than twice the largest chunk freed so far is free there, which
    is every time a pass frees its tiles together, so the next pass faults every page in again (bimodal
    step times: 3.4 or 8.7 s for the same step). Other C libraries are left as they are."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
