"""Length-grouped batches for training loops without transformers' ``Trainer``.

Kept in-house rather than ``transformers.trainer_pt_utils.LengthGroupedSampler``: that sampler permutes with
``torch.randperm``, sorts each mega-batch longest first, puts the longest batch first and never shuffles the
batches, so it would change the training order (hence the weights) of every model built with this one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def length_grouped_batches(lengths: Sequence[int], batch_size: int, seed: int, *, window: int = 50,
                           group: bool = True) -> list[list[int]]:
    """One epoch of batches (lists of indices) in a seeded random order.

    The indices are shuffled (``random.Random(seed)``); with ``group``, each run of ``window`` batches' worth is
    sorted by length (stably) and cut into batches, and the batches are shuffled by the same generator: a batch
    holds examples of similar length (less padding) and every seed mixes differently. Without ``group``, the
    shuffled indices are cut as they are.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if not group:
        return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    size = window * batch_size
    batches = []
    for start in range(0, len(order), size):
        chunk = sorted(order[start:start + size], key=lambda i: lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches
