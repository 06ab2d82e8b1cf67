"""Apache Parquet: one row per decision, written a row group at a time (needs pyarrow, the
`export` extra).

Columns: event_id, created_at (UTC), context (list of floats), candidates (list of arm
ids), arm, slot, propensity, probabilities (per candidate; null when only the propensity
is known), model_version, policy, explore, scores (list of {arm, mean, bonus, ucb}),
reward, reward_received_at and late (null without a reward), baseline_arm, rofu_arm and
rofu_probabilities (apprentice mode; see `rofu.service.deciding.apprentice`), deferred,
activated_at,
activation_late and active (false: a deferred decision not activated in time, which
training and evaluation leave out), named_context (the named features the request sent,
as JSON text; null for a dense context) and arm_features (arm id -> the features it was
scored with, for the candidates the request gave its own).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from rofu.service.log.pages import LoggedDecision

INSTALL = "pip install 'rofu[export]'"


class MissingPyarrow(RuntimeError):
    """Parquet was asked for without pyarrow installed."""


def _schema(pa: Any) -> Any:
    when = pa.timestamp("us", tz="UTC")
    score = pa.struct(
        [
            ("arm", pa.string()),
            ("mean", pa.float64()),
            ("bonus", pa.float64()),
            ("ucb", pa.float64()),
        ]
    )
    return pa.schema(
        [
            ("event_id", pa.string()),
            ("created_at", when),
            ("context", pa.list_(pa.float64())),
            ("candidates", pa.list_(pa.string())),
            ("arm", pa.string()),
            ("slot", pa.int32()),
            ("propensity", pa.float64()),
            ("probabilities", pa.list_(pa.float64())),
            ("model_version", pa.int64()),
            ("policy", pa.string()),
            ("explore", pa.bool_()),
            ("scores", pa.list_(score)),
            ("reward", pa.float64()),
            ("reward_received_at", when),
            ("late", pa.bool_()),
            ("baseline_arm", pa.string()),
            ("rofu_arm", pa.string()),
            ("rofu_probabilities", pa.list_(pa.float64())),
            ("deferred", pa.bool_()),
            ("activated_at", when),
            ("activation_late", pa.bool_()),
            ("active", pa.bool_()),
            ("named_context", pa.string()),
            ("arm_features", pa.map_(pa.string(), pa.list_(pa.float64()))),
        ]
    )


def parquet_row(record: LoggedDecision) -> dict[str, Any]:
    """The Parquet row of a record (also the JSON of `GET /v1/decisions`, less the types)."""
    row = dataclasses.asdict(record)
    row["arm"] = row.pop("arm_id")
    row["active"] = record.active
    if record.named_context is not None:
        row["named_context"] = json.dumps(record.named_context, sort_keys=True)
    if record.arm_features is not None:
        row["arm_features"] = list(record.arm_features.items())
    return row


def write_parquet(records: Iterable[LoggedDecision], path: Path, *, row_group: int = 10_000) -> int:
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
