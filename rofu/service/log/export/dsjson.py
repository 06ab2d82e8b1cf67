"""Vowpal Wabbit's decision-service JSON (DSJSON): one event per line, as `vw --dsjson`
reads.

Per event: `c` holds the context (namespace `x`, features `"0"`, `"1"`, ...) and, in
`_multi`, one object per candidate in the logged order (namespace `arm` with the arm's
id, and `z` with the features it was scored with: the request's own when it sent them,
else the catalogue's). `a` lists the candidates' 1-based positions with the chosen one
first, and `p` their probabilities in that order (left out when only the chosen arm's is
known). A rewarded event carries VW's label: `_label_cost` = -reward (VW minimises cost),
`_label_probability` = the propensity, `_label_Action` and `_labelIndex` (1- and 0-based
positions of the chosen arm in `_multi`), and the outcome in `o`, whose `ActionTaken`
says, as in Personalizer's logs, whether a deferred decision was activated (false for one
never activated, and for a decision not deferred, which needs no activation). An event
without a reward has no label, so VW only predicts on it. A deferred decision not
activated in time carries `"_skipLearn": true`, as Personalizer's logs do: VW's reader
skips the event, so VW never learns from it (and rofu never trains on or evaluates it).
VW ignores the `rofu` object, which keeps every other field of the decision's record
(`rofu.client.records.DecisionRecord`): the policy, the per-arm scores, the late flag,
the activation, apprentice mode's baseline and rofu's choice, the named context as sent
(`c` holds its hashed vector, what the model read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from rofu.client.records import DecisionRecord

#: DSJSON's format version (VW's `Version` field), not the model's.
DSJSON_VERSION = "1"
#: Record fields the `rofu` object leaves out: VW's own fields carry them (`EventId`,
#: `Timestamp`, `c`, `a`, `_skipLearn`), or, for `slot`, a DSJSON reader has no use for it.
NOT_IN_EXTENSION = frozenset(
    {"event_id", "created_at", "context", "candidates", "arm_features", "active", "slot"}
)


def dsjson_event(
    record: DecisionRecord, arm_features: Mapping[str, Sequence[float]] | None = None
) -> dict[str, Any]:
    """The DSJSON object of one logged decision."""
    chosen = record.chosen_index
    order = [chosen] + [i for i in range(len(record.candidates)) if i != chosen]
    event: dict[str, Any] = {}
    taken = record.deferred and record.activated_at is not None
    if record.reward is not None:
        event |= {
            "_label_cost": -record.reward,
            "_label_probability": record.propensity,
            "_label_Action": chosen + 1,
            "_labelIndex": chosen,
            "o": [{"v": record.reward, "EventId": record.event_id, "ActionTaken": taken}],
        }
    if not record.active:
        event["_skipLearn"] = True
    event |= {
        "Timestamp": record.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "Version": DSJSON_VERSION,
        "EventId": record.event_id,
        "a": [i + 1 for i in order],
        "c": {
            "x": {str(i): value for i, value in enumerate(record.context)},
            "_multi": [_action(arm, _features(record, arm_features)) for arm in record.candidates],
        },
    }
    if record.probabilities is not None:
        event["p"] = [record.probabilities[i] for i in order]
    event["VWState"] = {"m": f"rofu/{record.model_version}"}
    if record.reward is not None:
        event["_original_label_cost"] = -record.reward
    event["rofu"] = _extension(record)
    return event


def _features(
    record: DecisionRecord, catalogue: Mapping[str, Sequence[float]] | None
) -> Mapping[str, Sequence[float]]:
    """The features each candidate was scored with: the request's own, else the catalogue's."""
    return {**(catalogue or {}), **(record.arm_features or {})}


def _action(arm: str, arm_features: Mapping[str, Sequence[float]] | None) -> dict[str, Any]:
    features = None if arm_features is None else arm_features.get(arm)
    action: dict[str, Any] = {"arm": {"id": arm}}
    if features:
        action["z"] = {str(i): value for i, value in enumerate(features)}
    return action


def _extension(record: DecisionRecord) -> dict[str, Any]:
    fields = record.model_dump(exclude=set(NOT_IN_EXTENSION))
    return {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in fields.items()
    }


def write_dsjson(
    records: Iterable[DecisionRecord],
    out: TextIO,
    arm_features: Mapping[str, Sequence[float]] | None = None,
) -> int:
    """Write one DSJSON line per record; returns how many."""
    count = 0
    for record in records:
        out.write(json.dumps(dsjson_event(record, arm_features), allow_nan=False) + "\n")
        count += 1
    return count
