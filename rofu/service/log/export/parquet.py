"""Apache Parquet: one row per decision, written a row group at a time (needs pyarrow, the
`export` extra).

The columns are the fields of the decision's record (`rofu.client.records.DecisionRecord`),
in its order, their types derived from the fields': event_id, created_at (UTC), context
(list of floats), candidates (list of arm ids), arm, slot, propensity, probabilities (per
candidate; null when only the propensity is known), model_version, policy, explore,
scores (list of {arm, mean, bonus, ucb}), reward, reward_received_at, late and
reward_metrics (null without a reward), baseline_arm, rofu_arm and rofu_probabilities
(apprentice mode and the holdout; see `rofu.service.deciding.apprentice`), experiment and
unit_id (while a holdout ran: `rofu.service.deciding.holdout`), named_context (the named
features the request sent, as JSON text; null for a dense context), arm_features (arm
id -> the features it was scored with, for the candidates the request gave its own),
deferred, activated_at, activation_late and active (false: a deferred decision not
activated in time, which training and evaluation leave out).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import islice
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from rofu.client.records import DecisionRecord

INSTALL = "pip install 'rofu[export]'"
#: Columns narrower than their field's type: a catalogue slot fits 32 bits.
NARROWER: dict[str, Callable[[Any], Any]] = {"slot": lambda pa: pa.int32()}


class MissingPyarrow(RuntimeError):
    """Parquet was asked for without pyarrow installed."""


def _required(annotation: Any) -> Any:
    """`annotation` without its `| None` (Arrow's null belongs to every type)."""
    if get_origin(annotation) in (Union, UnionType):
        (inner,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner
    return annotation


def _free_form(annotation: Any) -> bool:
    """A free-form object (`dict[str, Any]`), which Parquet holds as JSON text."""
    required = _required(annotation)
    return get_origin(required) is dict and get_args(required)[1] is Any


def _arrow(pa: Any, annotation: Any) -> Any:
    """The Arrow type of a record field's annotation."""
    annotation = _required(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if _free_form(annotation):
        return pa.string()
    if origin is list:
        return pa.list_(_arrow(pa, args[0]))
    if origin is dict:
        return pa.map_(_arrow(pa, args[0]), _arrow(pa, args[1]))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = annotation.model_fields.items()
        return pa.struct([(name, _arrow(pa, field.annotation)) for name, field in fields])
    scalars = {
        str: pa.string(),
        bool: pa.bool_(),
        int: pa.int64(),
        float: pa.float64(),
        datetime: pa.timestamp("us", tz="UTC"),
    }
    return scalars[annotation]


def _schema(pa: Any) -> Any:
    """One column per record field, in the record's order."""
    columns = []
    for name, field in DecisionRecord.model_fields.items():
        narrower = NARROWER.get(name)
        columns.append((name, _arrow(pa, field.annotation) if narrower is None else narrower(pa)))
    return pa.schema(columns)


def parquet_row(record: DecisionRecord) -> dict[str, Any]:
    """The Parquet row of a record (also the JSON of `GET /v1/decisions`, less the types)."""
    row = record.model_dump()
    for name, value in row.items():
        if isinstance(value, dict):  # JSON text, or a map's (key, value) pairs
            free = _free_form(DecisionRecord.model_fields[name].annotation)
            row[name] = json.dumps(value, sort_keys=True) if free else list(value.items())
    return row


def write_parquet(records: Iterable[DecisionRecord], path: Path, *, row_group: int = 10_000) -> int:
    """Write the records to `path`; returns how many.

    Raises:
        MissingPyarrow: pyarrow is not installed.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError as exc:
        raise MissingPyarrow(f"--format parquet needs pyarrow: {INSTALL}") from exc
    schema = _schema(pa)
    count = 0
    iterator = iter(records)
    with pq.ParquetWriter(path, schema) as writer:
        while rows := [parquet_row(r) for r in islice(iterator, row_group)]:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            count += len(rows)
        if count == 0:
            writer.write_table(schema.empty_table())
    return count
