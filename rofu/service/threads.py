"""torch's intra-op threads: set once per process from `ROFU_TORCH_THREADS`, and logged.

Under CPU oversubscription (several workers or a client on the same cores) OpenMP's
spin-waiting threads slow each other down, so the count is a deployment choice, not
torch's guess.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("rofu.threads")


def apply_torch_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 keeps torch's default) and log the count in use.

    Args:
        threads: the `torch_threads` setting; 0 means torch's default.

    Returns:
        The number of intra-op threads torch now uses.
    """
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    count = torch.get_num_threads()
    source = f"ROFU_TORCH_THREADS={threads}" if threads else "torch's default"
    log.info("torch intra-op threads: %d (%s)", count, source)
    return count
