"""One record of a decision: every field of `DecisionRecord` has a source column (or an
explicit derivation), every decision column is carried (or listed as internal), and the
record is built from the rows by field name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from rofu.client.records import DecisionRecord
from rofu.client.schemas import ArmScore
from rofu.service.db.tables import DecisionRow, RewardRow
from rofu.service.log.export.dsjson import NOT_IN_EXTENSION, dsjson_event
from rofu.service.log.export.parquet import parquet_row
from rofu.service.log.record import (
    COPIED,
    DERIVED,
    INTERNAL,
    INTERNAL_REWARD,
    Derivation,
    decision_record,
)

COLUMNS = {
    f"{table.__tablename__}.{column.name}"
    for table in (DecisionRow, RewardRow)
    for column in table.__table__.columns
}
WHEN = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def unsourced(
    record: type[BaseModel], derived: Mapping[str, Derivation], columns: set[str]
) -> list[str]:
    """The record's fields that are neither a decision column nor derived from columns."""
    missing = [
        name
        for name in record.model_fields
        if name not in derived and f"decisions.{name}" not in columns
    ]
    broken = [
        f"{name} <- {column}"
        for name, derivation in derived.items()
        for column in derivation.columns
        if column not in columns
    ]
    return missing + broken


def uncarried(
    columns: Iterable[str],
    record: type[BaseModel],
    derived: Mapping[str, Derivation],
    internal: set[str],
) -> list[str]:
    """The columns the record neither copies nor derives a field from, and are not internal."""
    read = {column for derivation in derived.values() for column in derivation.columns}
    copied = {f"decisions.{name}" for name in record.model_fields if name not in derived}
    return sorted(set(columns) - read - copied - internal)


def test_decision_record_every_field_has_a_source_column():
    assert unsourced(DecisionRecord, DERIVED, COLUMNS) == []
    assert set(COPIED) | set(DERIVED) == set(DecisionRecord.model_fields)


def test_decision_record_carries_every_decision_column_not_internal():
    assert uncarried(COLUMNS, DecisionRecord, DERIVED, set(INTERNAL | INTERNAL_REWARD)) == []
    assert INTERNAL | INTERNAL_REWARD <= COLUMNS  # no stale name hides a real column


def test_decision_record_checks_catch_a_field_or_a_column_added_alone():
    class Wider(DecisionRecord):
        colour: str

    assert unsourced(Wider, DERIVED, COLUMNS) == ["colour"]
    stale = {**DERIVED, "arm": Derivation(("decisions.arm_name",), DERIVED["arm"].of)}
    assert unsourced(DecisionRecord, stale, COLUMNS) == ["arm <- decisions.arm_name"]
    internal = set(INTERNAL | INTERNAL_REWARD)
    assert uncarried(COLUMNS | {"decisions.colour"}, DecisionRecord, DERIVED, internal) == [
        "decisions.colour"
    ]


def _rows() -> tuple[DecisionRow, RewardRow]:
    decision = DecisionRow(
        event_id="e-1",
        created_at=WHEN,
        context=[1, 0.5],  # an int as JSON may hold it
        candidates=["a", "b"],
        arm_id="b",
        slot=1,
        propensity=1.0,
        probabilities=[0.0, 1.0],
        model_version=3,
        explore=False,
        policy="apprentice",
        scores=[{"arm": arm, "mean": 0.1, "bonus": 0.2, "ucb": 0.3} for arm in "ab"],
        request_hash="h",
        baseline_arm="b",
        rofu_arm="a",
        rofu_probabilities=[0.75, 0.25],
        trained_in=None,
        deferred=True,
        activated_at=WHEN,
        activation_late=False,
        named_context={"user": {"age": 31.0}},
        arm_features={"a": [1.0, 2.0]},
    )
    return decision, RewardRow(event_id="e-1", value=2.5, received_at=WHEN, repeats=0, late=True)


def test_decision_record_is_built_from_the_rows_by_field_name():
    decision, reward = _rows()
    record = decision_record(decision, reward)
    for name in COPIED:
        assert getattr(record, name) == getattr(decision, name), name
    assert (record.arm, record.reward, record.reward_received_at, record.late) == (
        "b",
        2.5,
        WHEN,
        True,
    )
    assert record.scores == [ArmScore(arm=arm, mean=0.1, bonus=0.2, ucb=0.3) for arm in "ab"]
    assert record.active  # deferred, activated in time
    assert (record.chosen_index, record.probabilities) == (1, [0.0, 1.0])
    unrewarded = decision_record(decision, None)
    assert (unrewarded.reward, unrewarded.reward_received_at, unrewarded.late) == (None,) * 3


@pytest.mark.parametrize(
    ("policy", "propensity", "expected"),
    [("cold-start", 0.5, [0.5, 0.5]), ("rofu", 1.0, [0.0, 1.0]), ("rofu", 0.7, None)],
)
def test_decision_record_derives_the_probabilities_of_rows_logged_without(
    policy, propensity, expected
):
    decision, _ = _rows()
    decision.probabilities, decision.policy, decision.propensity = None, policy, propensity
    assert decision_record(decision, None).probabilities == expected


def test_decision_record_reaches_dsjson_and_parquet_whole():
    record = decision_record(*_rows())
    extension = dsjson_event(record)["rofu"]
    assert set(DecisionRecord.model_fields) >= NOT_IN_EXTENSION
    assert set(extension) == set(DecisionRecord.model_fields) - NOT_IN_EXTENSION
    assert extension["activated_at"] == WHEN.isoformat()
    row = parquet_row(record)
    assert list(row) == list(DecisionRecord.model_fields)
    assert row["named_context"] == '{"user": {"age": 31.0}}'
    assert row["arm_features"] == [("a", [1.0, 2.0])]


def test_decision_record_parquet_columns_are_its_fields_with_their_types():
    pa = pytest.importorskip("pyarrow")
    from rofu.service.log.export.parquet import _schema

    schema = _schema(pa)
    assert schema.names == list(DecisionRecord.model_fields)
    when = pa.timestamp("us", tz="UTC")
    score = pa.struct([(name, pa.float64()) for name in ("mean", "bonus", "ucb")])
    expected = {
        "created_at": when,
        "slot": pa.int32(),
        "context": pa.list_(pa.float64()),
        "scores": pa.list_(pa.struct([("arm", pa.string()), *score])),
        "late": pa.bool_(),
        "named_context": pa.string(),
        "arm_features": pa.map_(pa.string(), pa.list_(pa.float64())),
        "activated_at": when,
    }
    assert {name: schema.field(name).type for name in expected} == expected
