"""The body of GET /v1/report: rofu against its holdout (`rofu.service.experiment`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class Interval(BaseModel):
    """An estimate with its 95% interval; nulls where the data cannot give one yet."""

    estimate: float | None
    low: float | None
    high: float | None


class Group(BaseModel):
    """One group of the experiment on one outcome."""

    units: int = Field(description="Units (unit ids, else decisions) with this outcome")
    mean: Interval = Field(description="Mean of the units' outcomes, 95% normal interval")


class Comparison(BaseModel):
    """rofu against the holdout on one outcome: the reward, or a guardrail metric."""

    rofu: Group
    holdout: Group
    difference: Interval = Field(description="rofu - holdout; 95%, for one look at a fixed n")
    lift: Interval = Field(description="(rofu - holdout) / |holdout|; delta method")
    sequential: Interval = Field(
        description="Anytime-valid 95% confidence sequence for the difference: valid however "
        "often the report is read (an asymptotic confidence sequence)"
    )
    p_value: float | None = Field(description="Anytime-valid p-value of no difference")
    significant: bool = Field(description="The confidence sequence excludes 0 now")


class SampleRatio(BaseModel):
    """The units' split against the configured share (chi-squared, 1 degree of freedom)."""

    expected_holdout_share: float
    observed_holdout_share: float | None
    p_value: float | None
    mismatch: bool = Field(description="p < 0.001: the split is off; do not trust the result")


class GroupCounts(BaseModel):
    """What one group holds: decisions, units, rewarded decisions."""

    decisions: int
    units: int
    rewarded: int


class ReportResponse(BaseModel):
    """rofu against the holdout, on the decisions made while the holdout ran."""

    holdout_share: float = Field(description="ROFU_HOLDOUT_SHARE now (0: no holdout runs)")
    salt: str = Field(description="ROFU_HOLDOUT_SALT now: the experiment's assignment")
    since: datetime | None = Field(description="The report's window starts here (null: all)")
    first_decision: datetime | None
    last_decision: datetime | None
    groups: dict[str, GroupCounts] = Field(description="`rofu` and `holdout`")
    reward: Comparison
    guardrails: dict[str, Comparison] = Field(
        description="Each metric apps sent with their rewards (`metrics`), compared likewise"
    )
    sample_ratio: SampleRatio
    warnings: list[str] = Field(default_factory=list)
