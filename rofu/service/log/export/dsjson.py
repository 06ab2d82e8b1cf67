"""Vowpal Wabbit's decision-service JSON (DSJSON): one event per line, as `vw --dsjson` reads.

Per event: `c` holds the context (namespace `x`, features `"0"`, `"1"`, ...) and, in
`_multi`, one object per candidate in the logged order (namespace `arm` with the arm's id,
and `z` with the features it was scored with: the request's own when it sent them, else
the catalogue's). `a` lists the candidates' 1-based
positions with the chosen one first, and `p` their probabilities in that order (left out
when only the chosen arm's is known). A rewarded event carries VW's label:
`_label_cost` = -reward (VW minimises cost), `_label_probability` = the propensity,
`_label_Action` and `_labelIndex` (1- and 0-based positions of the chosen arm in
`_multi`), and the outcome in `o`. An event without a reward has no label, so VW only
predicts on it. A deferred decision not activated in time carries `"_skipLearn": true`,
as Personalizer's logs do: VW's reader skips the event, so VW never learns from it (and
rofu never trains on or evaluates it). VW ignores the `rofu` object, which keeps what VW
has no field for: the policy, the per-arm scores, the late flag, the activation,
apprentice mode's baseline and rofu's choice, the named context as sent (`c` holds
its hashed vector, what the model read).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from rofu.service.log.pages import LoggedDecision

#: DSJSON's format version (VW's `Version` field), not the model's.
DSJSON_VERSION = "1"


def dsjson_event(
    record: LoggedDecision, arm_features: Mapping[str, Sequence[float]] | None = None
) -> dict[str, Any]:
    """The DSJSON object of one logged decision."""
    chosen = record.chosen_index
    order = [chosen] + [i for i in range(len(record.candidates)) if i != chosen]
    event: dict[str, Any] = {}
    if record.reward is not None:
        event |= {
            "_label_cost": -record.reward,
            "_label_probability": record.propensity,
            "_label_Action": chosen + 1,
            "_labelIndex": chosen,
            "o": [{"v": record.reward, "EventId": record.event_id, "ActionTaken": False}],
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
    record: LoggedDecision, catalogue: Mapping[str, Sequence[float]] | None
) -> Mapping[str, Sequence[float]]:
    """The features each candidate was scored with: the request's own, else the catalogue's."""
    return {**(catalogue or {}), **(record.arm_features or {})}


def _action(arm: str, arm_features: Mapping[str, Sequence[float]] | None) -> dict[str, Any]:
    features = None if arm_features is None else arm_features.get(arm)
    action: dict[str, Any] = {"arm": {"id": arm}}
    if features:
        action["z"] = {str(i): value for i, value in enumerate(features)}
    return action


def _extension(record: LoggedDecision) -> dict[str, Any]:
    received, activated = record.reward_received_at, record.activated_at
    return {
        "model_version": record.model_version,
        "policy": record.policy,
        "explore": record.explore,
        "arm": record.arm_id,
        "propensity": record.propensity,
        "probabilities": record.probabilities,
        "scores": [dataclasses.asdict(score) for score in record.scores],
        "reward": record.reward,
        "reward_received_at": None if received is None else received.isoformat(),
        "late": record.late,
        "baseline_arm": record.baseline_arm,
        "rofu_arm": record.rofu_arm,
        "rofu_probabilities": record.rofu_probabilities,
        "deferred": record.deferred,
        "activated_at": None if activated is None else activated.isoformat(),
        "activation_late": record.activation_late,
        "named_context": record.named_context,
    }


def write_dsjson(
    records: Iterable[LoggedDecision],
    out: TextIO,
    arm_features: Mapping[str, Sequence[float]] | None = None,
) -> int:
    """Write one DSJSON line per record; returns how many."""
    count = 0
    for record in records:
        out.write(json.dumps(dsjson_event(record, arm_features), allow_nan=False) + "\n")
        count += 1
    return count
