"""Apprentice mode (`ROFU_LEARNING_MODE=apprentice`), as in Azure Personalizer.

The app sends its own choice as `baseline_arm`, one of the candidates. In apprentice
mode rofu serves it, logs it with rofu's scores and learns from it like any logged
decision. The row says who chose: the baseline arm with probability 1 (the app's choice,
whose randomness rofu cannot know, is logged as the deterministic baseline policy's),
policy `apprentice`, and beside it what rofu's own rule would have chosen (`rofu_arm`,
from the same draw it would have served) with its exact probabilities
(`rofu_probabilities`), so that `rofu evaluate` can compare the two policies. In online
mode a `baseline_arm` is recorded for that comparison and never served.
"""

from __future__ import annotations

from collections.abc import Sequence

from rofu.service.api.schemas import SelectRequest
from rofu.service.db.tables import DecisionRow
from rofu.service.deciding.catalogue import Arm
from rofu.service.errors import InvalidInput

APPRENTICE = "apprentice"


def check_baseline(body: SelectRequest, candidates: Sequence[Arm], *, apprentice: bool) -> None:
    """Refuse a `baseline_arm` that is not a candidate, or none in apprentice mode.

    Raises:
        InvalidInput: naming `baseline_arm`.
    """
    baseline = body.baseline_arm
    if baseline is None:
        if apprentice:
            raise InvalidInput(
                "baseline_arm: required in apprentice mode (ROFU_LEARNING_MODE=apprentice), "
                "which serves the app's own choice: send it, one of the candidates",
                field="baseline_arm",
            )
        return
    if any(arm.id == baseline for arm in candidates):
        return
    if baseline in (body.exclude or ()):
        why = "is excluded"
    elif body.arms is not None:
        why = "is not among `arms`"
    else:
        why = "is not an active arm of the catalogue"
    raise InvalidInput(
        f"baseline_arm: {baseline!r} {why}; it must be one of the candidates",
        field="baseline_arm",
    )


def with_baseline(
    row: DecisionRow, baseline_arm: str | None, candidates: Sequence[Arm], *, serve: bool
) -> DecisionRow:
    """The row to store for rofu's decision `row`: with the baseline recorded, and when
    `serve`, the baseline chosen with probability 1 and rofu's choice kept beside it."""
    if baseline_arm is None:
        return row
    row.baseline_arm = baseline_arm
    if not serve:
        return row
    baseline = next(arm for arm in candidates if arm.id == baseline_arm)
    row.rofu_arm, row.rofu_probabilities = row.arm_id, row.probabilities
    row.arm_id, row.slot, row.propensity = baseline.id, baseline.slot, 1.0
    row.probabilities = [float(arm.id == baseline.id) for arm in candidates]
    row.policy = APPRENTICE
    return row
