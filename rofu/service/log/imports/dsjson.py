"""Reading one line of a DSJSON log (`rofu.service.log.export.dsjson` writes them; so did
Personalizer's log mirror) into a checked `Event`, before any setting is applied.

An event is a JSON object with `EventId`, `Timestamp`, `c` (the context and, in `_multi`,
one object per action in the logged order) and `a` (the actions' 1-based positions in
`_multi`, the chosen one first: a permutation of 1..K). Its probabilities: `p`, in `a`'s
order (mapped back to `_multi`'s order here), and `_label_probability`, the chosen
action's (else `p`'s first). A rewarded event has `_label_cost` (reward = -cost).

- Action ids: rofu's export names an action in its `arm` namespace (`{"arm": {"id":
  "arm-1"}}`); Personalizer's logs in VW's `_tag`; else a string `id` feature at the
  action's top level. An action with none of them is refused.
- Features: a line with a `rofu` object is rofu's export: the context is its
  `named_context` when set, else the dense `x` namespace (`"0"`, `"1"`, ...), and an
  action's features are its dense `z` namespace. Any other line is Personalizer's: every
  key of `c` but `_multi` is a named context, every key of an action a named feature
  (a namespace given as a list of objects, Personalizer's feature lists, is the objects
  merged). Keys starting with `_` are left out, as VW leaves them out.
- Activation: `"_skipLearn": true` marks a deferred decision not activated in time; an
  outcome in `o` with `"ActionTaken": true` a deferred decision that was activated (both:
  activated too late).

Refused (`DsjsonError`, one reason): a line that is not a JSON object, NaN or infinite
numbers, a missing field, `a` not a permutation of 1..K, `p` of another length, the
chosen action's probability outside (0, 1] or another's outside [0, 1], probabilities
not summing to 1 within `TOLERANCE`, `_label_probability` differing from `p`'s first
by more, `_label_Action`/`_labelIndex` naming another action than `a`'s first.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rofu.client.schemas import ARM_ID_PATTERN, EVENT_ID_PATTERN

#: How far probabilities may sum from 1 (and `_label_probability` differ from `p`'s first).
TOLERANCE = 1e-3
Features = list[float] | dict[str, Any]  # dense numbers, or a named object


class DsjsonError(ValueError):
    """A line that cannot be imported; the message says why."""


@dataclass(frozen=True)
class Action:
    """One candidate: its arm id and its features (dense or named; None: none given)."""

    arm: str
    features: Features | None = None


@dataclass(frozen=True)
class Event:
    """One logged decision as the file states it; probabilities in `actions` order."""

    event_id: str
    created_at: datetime
    context: Features
    actions: tuple[Action, ...]
    chosen: int  # the chosen action's index in `actions`
    propensity: float
    probabilities: list[float] | None
    reward: float | None
    skip_learn: bool = False
    activated: bool = False
    extension: dict[str, Any] = field(default_factory=dict)  # the `rofu` object, if any

    @property
    def deferred(self) -> bool:
        """Logged as deferred: activated, or skipped for want of an activation in time."""
        return self.skip_learn or self.activated


def parse_line(text: str) -> Event:
    """The event of one DSJSON line.

    Raises:
        DsjsonError: what is wrong with it (see the module docstring).
    """
    try:
        event = json.loads(text, parse_constant=_constant, parse_float=_float)
    except json.JSONDecodeError as exc:
        raise DsjsonError(f"not JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise DsjsonError(f"not a JSON object but a {type(event).__name__}")
    c = _get(event, "c", dict)
    given = event.get("rofu")
    extension: dict[str, Any] = given if isinstance(given, dict) else {}
    rofu = isinstance(given, dict)
    actions = tuple(_action(item, j, rofu) for j, item in enumerate(_get(c, "_multi", list)))
    if not actions:
        raise DsjsonError("c._multi: no action")
    _unique(actions)
    order = _permutation(event, len(actions))
    probabilities, propensity = _probabilities(event, order)
    return Event(
        event_id=_id(_get(event, "EventId", str), EVENT_ID_PATTERN, "EventId"),
        created_at=timestamp(_get(event, "Timestamp", str)),
        context=_context(c, extension) if rofu else _named(c, "c"),
        actions=actions,
        chosen=order[0],
        propensity=propensity,
        probabilities=probabilities,
        reward=_reward(event),
        skip_learn=_flag(event, "_skipLearn"),
        activated=_taken(event.get("o")),
        extension=extension,
    )


def _constant(name: str) -> float:
    raise DsjsonError(f"{name} is not a number JSON allows")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DsjsonError(f"{text} is not a finite number")
    return value


def _get(mapping: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    value = mapping.get(key)
    if value is None:
        raise DsjsonError(f"{where}{key}: missing")
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise DsjsonError(f"{where}{key}: expected a {kind.__name__}, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "boolean" if isinstance(value, bool) else type(value).__name__


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DsjsonError(f"{where}: expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise DsjsonError(f"{where}: {value} is not a finite number")
    return number


def _id(value: str, pattern: str, where: str) -> str:
    if not re.fullmatch(pattern, value):
        raise DsjsonError(f"{where}: {value[:140]!r} is not 1-128 characters of [A-Za-z0-9_.:-]")
    return value


def timestamp(text: str) -> datetime:
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text.strip())  # VW writes up to 7 digits
    try:
        moment = datetime.fromisoformat(trimmed)
    except ValueError:
        raise DsjsonError(f"Timestamp: {text[:60]!r} is not an ISO 8601 time") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _action(item: object, j: int, rofu: bool) -> Action:
    where = f"c._multi.{j}"
    if not isinstance(item, dict):
        raise DsjsonError(f"{where}: an action is an object, got {_kind(item)}")
    arm = item.get("arm")
    if isinstance(arm, dict) and isinstance(arm.get("id"), str):
        arm_id, key = arm["id"], f"{where}.arm.id"
    elif isinstance(item.get("_tag"), str):
        arm_id, key = item["_tag"], f"{where}._tag"
    elif isinstance(item.get("id"), str):
        arm_id, key = item["id"], f"{where}.id"
    else:
        raise DsjsonError(f"{where}: the action has no id (arm.id, _tag or a string id)")
    _id(arm_id, ARM_ID_PATTERN, key)
    if rofu:
        z = item.get("z")
        return Action(arm_id, None if z is None else _dense(z, f"{where}.z"))
    named = _named({k: v for k, v in item.items() if k != "arm"}, where)
    return Action(arm_id, named or None)


def _unique(actions: tuple[Action, ...]) -> None:
    first: dict[str, int] = {}
    for j, action in enumerate(actions):
        if action.arm in first:
            raise DsjsonError(
                f"c._multi.{j}: action {action.arm!r} repeats c._multi.{first[action.arm]}"
            )
        first[action.arm] = j


def _dense(value: object, where: str) -> list[float]:
    """A namespace of features "0", "1", ... as the list of their values."""
    if not isinstance(value, dict) or set(value) != {str(i) for i in range(len(value))}:
        raise DsjsonError(f"{where}: expected dense features named 0, 1, ...")
    return [_number(value[str(i)], f"{where}.{i}") for i in range(len(value))]


def _context(c: dict[str, Any], extension: dict[str, Any]) -> Features:
    named = extension.get("named_context")
    if named is not None:
        if not isinstance(named, dict):
            raise DsjsonError(f"rofu.named_context: expected an object, got {_kind(named)}")
        return named
    return _dense(c.get("x", {}), "c.x")


def _named(mapping: dict[str, Any], where: str) -> dict[str, Any]:
    """A named object of a DSJSON object: `_` keys left out, lists of objects merged."""
    named: dict[str, Any] = {}
    for key, value in mapping.items():
        if key.startswith("_"):
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            value = _merged(value, f"{where}.{key}")
        named[key] = value
    return named


def _merged(objects: list[dict[str, Any]], where: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for i, item in enumerate(objects):
        for key, value in item.items():
            if key in merged and merged[key] != value:
                raise DsjsonError(f"{where}.{i}.{key}: given again with another value")
            merged[key] = value
    return merged


def _permutation(event: dict[str, Any], k: int) -> list[int]:
    """`a` as 0-based indexes into `_multi`, the chosen first; checked against the label."""
    a = _get(event, "a", list)
    if sorted(a) != list(range(1, k + 1)) or any(isinstance(i, bool) for i in a):
        raise DsjsonError(f"a: {json.dumps(a)[:80]} is not a permutation of 1..{k} (the actions)")
    for key, offset in (("_label_Action", 1), ("_labelIndex", 0)):
        value = event.get(key)
        if value is not None and value != a[0] - 1 + offset:
            raise DsjsonError(f"{key}: {value} is not the chosen action a[0] = {a[0]}")
    return [i - 1 for i in a]


def _probabilities(event: dict[str, Any], order: list[int]) -> tuple[list[float] | None, float]:
    """(each action's probability in `_multi` order, or None; the chosen one's)."""
    p = event.get("p")
    label = event.get("_label_probability")
    if p is not None and (not isinstance(p, list) or len(p) != len(order)):
        size = len(p) if isinstance(p, list) else _kind(p)
        raise DsjsonError(f"p: {size} probabilities for {len(order)} actions")
    if p is None and label is None:
        raise DsjsonError("no probability of the chosen action (_label_probability or p)")
    chosen = _number(label if label is not None else p[0] if p else None, "_label_probability")
    if not 0.0 < chosen <= 1.0:
        raise DsjsonError(f"the chosen action's probability {chosen:g} is outside (0, 1]")
    if p is None:
        return None, chosen
    values = [_number(v, f"p.{i}") for i, v in enumerate(p)]
    if odd := [f"p.{i} = {v:g}" for i, v in enumerate(values) if not 0.0 <= v <= 1.0]:
        raise DsjsonError(f"{', '.join(odd)} outside [0, 1]")
    if values[0] <= 0.0 or abs(values[0] - chosen) > TOLERANCE:
        raise DsjsonError(f"p.0 = {values[0]:g} is not _label_probability = {chosen:g}")
    if abs(sum(values) - 1.0) > TOLERANCE:
        raise DsjsonError(f"p sums to {sum(values):.6g}, not 1 (within {TOLERANCE:g})")
    probabilities = [0.0] * len(order)
    for position, index in enumerate(order):
        probabilities[index] = values[position]
    return probabilities, chosen


def _reward(event: dict[str, Any]) -> float | None:
    cost = event.get("_label_cost")
    return None if cost is None else 0.0 - _number(cost, "_label_cost")


def _flag(event: dict[str, Any], key: str) -> bool:
    value = event.get(key, False)
    if not isinstance(value, bool):
        raise DsjsonError(f"{key}: expected true or false, got {_kind(value)}")
    return value


def _taken(outcomes: object) -> bool:
    if outcomes is None:
        return False
    if not isinstance(outcomes, list) or not all(isinstance(o, dict) for o in outcomes):
        raise DsjsonError("o: expected a list of objects")
    return any(o.get("ActionTaken") is True for o in outcomes)
