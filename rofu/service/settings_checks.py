"""The checks that read several settings at once (`Settings` runs them after validating
each field): each failure is one line naming the setting at fault."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Arm(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def features(self) -> Sequence[float] | None: ...


class Checked(Protocol):
    """What the checks read of `rofu.service.settings.Settings` (which runs them, so this
    module cannot import it)."""

    @property
    def arms(self) -> Sequence[_Arm]: ...
    @property
    def max_arms(self) -> int: ...
    @property
    def arm_feature_dim(self) -> int: ...
    @property
    def holdout_share(self) -> float: ...
    @property
    def learning_mode(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def database_url(self) -> str: ...
    @property
    def redis_url(self) -> str | None: ...
    @property
    def db_lock_timeout_ms(self) -> int: ...
    @property
    def db_statement_timeout_ms(self) -> int: ...
    @property
    def gate_window(self) -> int: ...
    @property
    def gate_min_rows(self) -> int: ...
    @property
    def training_window(self) -> int: ...
    @property
    def data_sample_size(self) -> int: ...


def check_consistent(settings: Checked) -> None:
    """Refuse settings that contradict each other.

    Raises:
        ValueError: naming the setting.
    """
    _check_arms(settings)
    if settings.holdout_share > 0 and settings.learning_mode == "apprentice":
        raise ValueError(
            "holdout_share: apprentice mode serves the baseline to everyone, so a "
            "holdout compares nothing; set it to 0 or use learning_mode=online"
        )
    if settings.mode == "production":
        if settings.database_url.startswith("sqlite"):
            raise ValueError("production mode needs a Postgres database_url, not SQLite")
        if settings.redis_url is None:
            raise ValueError("production mode needs redis_url (the checkpoint bus)")
    if settings.db_lock_timeout_ms > settings.db_statement_timeout_ms:
        raise ValueError(
            f"db_lock_timeout_ms ({settings.db_lock_timeout_ms}) exceeds "
            f"db_statement_timeout_ms ({settings.db_statement_timeout_ms}): the statement "
            "would be cancelled before its lock wait ends"
        )
    if settings.gate_window < settings.gate_min_rows:
        raise ValueError(f"gate_window is below gate_min_rows ({settings.gate_min_rows})")
    if settings.training_window > settings.data_sample_size:
        raise ValueError(
            f"training_window ({settings.training_window}) exceeds data_sample_size "
            f"({settings.data_sample_size}): the sample holds the window's rows"
        )


def _check_arms(settings: Checked) -> None:
    ids = [arm.id for arm in settings.arms]
    if len(set(ids)) != len(ids):
        raise ValueError("arms: arm ids must be unique")
    if len(ids) > settings.max_arms:
        raise ValueError(f"arms: {len(ids)} arms exceed max_arms={settings.max_arms}")
    for arm in settings.arms:
        width = len(arm.features) if arm.features is not None else 0
        if width != settings.arm_feature_dim:
            raise ValueError(
                f"arms: arm {arm.id!r} has {width} features, arm_feature_dim is "
                f"{settings.arm_feature_dim}"
            )
