"""What a training run trains on: the data sample it continues and its new rows.

For an arm-feature network every row carries the arm features its chosen arm was scored
with (`Transitions.features`): the request's own when it sent them (`arm_features` of
/v1/select), else the catalogue's. A sample stored before rows carried their features
takes the catalogue's, which is exact: an arm's catalogue features never change.
"""

from __future__ import annotations

import torch

from rofu.models import Checkpoint, DataBuffer, Transitions
from rofu.service.db import repository
from rofu.service.settings import Settings


def continued_buffer(
    settings: Settings,
    previous: Checkpoint | None,
    version: int,
    arm_features: torch.Tensor | None,
) -> DataBuffer:
    """The data sample run `version` continues (the previous checkpoint's, or none), at
    most `data_sample_size` rows, its reservoir drawn from a generator of the version; with
    a `training_window`, the last that many rows (`DataBuffer`).

    Args:
        arm_features: the catalogue's (slots, F) features; None for a network with one
            output per arm.
    """
    generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + version)
    size = settings.data_sample_size
    window = settings.training_window or None
    if previous is None:
        return DataBuffer(
            settings.context_dim,
            max_size=size,
            generator=generator,
            arm_feature_dim=settings.arm_feature_dim,
            window=window,
        )
    data = previous.data
    if arm_features is not None and data.sample.features is None:
        data = data.with_sample(data.sample.with_features(arm_features))
    if len(data.sample) > size:  # the sample-size setting shrank: keep a uniform subset,
        n = len(data.sample)  # or a window's newest rows (they are in order)
        if window is None:
            keep = torch.randperm(n, generator=generator)[:size]
        else:
            keep = torch.arange(n - size, n)
        data = data.with_sample(data.sample.subset(keep))
    return DataBuffer.restore(data, max_size=size, generator=generator, window=window)


def transitions(
    trained: list[tuple[repository.TrainingRow, float]],
    context_dim: int,
    arm_features: torch.Tensor | None,
) -> Transitions:
    """(row, target) pairs as transitions; with the catalogue's `arm_features` (an
    arm-feature network), each carries its chosen arm's features as decided."""
    x = torch.tensor([row.context for row, _ in trained], dtype=torch.float32)
    features = None
    if arm_features is not None:
        features = torch.stack(
            [
                arm_features[row.slot]
                if row.arm_features is None
                else torch.tensor(row.arm_features, dtype=torch.float32)
                for row, _ in trained
            ]
        )
    return Transitions(
        x.view(len(trained), context_dim),
        torch.tensor([row.slot for row, _ in trained], dtype=torch.int64),
        torch.tensor([target for _, target in trained], dtype=torch.float32),
        features,
    )
