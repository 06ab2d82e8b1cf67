"""The Personalizer-compatible facade as domain logic: Personalizer's Rank, Reward and
Activate calls carried out by rofu's own `decide`, `record_reward` and `activate`.

A Rank request becomes one `SelectRequest`:

- `contextFeatures`, a list of objects, is merged into one named context
  (`rofu.service.personalizer.features.merge`: namespaces merge key by key; a feature given
  twice with another value is a 400 naming both places). Omitted: no features.
- the actions that are not excluded are the candidate `arms`, in the request's order;
  each must be an active arm of the catalogue (`POST /v1/arms`), else a 400 naming the
  action. Excluded actions are not candidates, need not be registered, and rank with
  probability 0. An excluded id that is not an action's is a 400.
- each action's `features` (a list of objects) is merged the same way into its named
  features: an arm-feature model hashes them into its `arm_features` (an action with
  `features: []` keeps its catalogue features); a model with one output per arm reads no
  arm features, so they are validated and then ignored, stored nowhere.
- `eventId` is the `event_id` (rofu's alphabet: refused otherwise, never rewritten),
  `deferActivation` is `defer`; in apprentice mode (`ROFU_LEARNING_MODE=apprentice`) the
  first candidate action is the `baseline_arm` served, as Personalizer serves the first
  action.

The ranking lists every action of the request: the chosen one first, then the others by
descending probability, ties in the request's order (excluded actions have probability
0, so they come after every action with a positive one). The probabilities are the
decision's exact ones. Errors of rofu's code name rofu's fields; `Fields.translated`
renames them to the request's (`context.user.age` becomes `contextFeatures.2.user.age`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from rofu.client.schemas import ARM_ID_PATTERN, EVENT_ID_PATTERN, SelectResponse
from rofu.service.api.schemas import SelectRequest
from rofu.service.db.engine import SessionFactory
from rofu.service.deciding.batch import Pending, Result
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.deciding.select import decide
from rofu.service.errors import Conflict, InvalidInput, ServiceError
from rofu.service.metrics import ServiceMetrics
from rofu.service.personalizer.features import Merged, merge
from rofu.service.personalizer.schemas import EVENT_ID_RULE, RankedAction, RankRequest, RankResponse
from rofu.service.rewards.activation import Activation, activate
from rofu.service.rewards.record import RewardBatcher, RewardOutcome, record_reward
from rofu.service.settings import Settings

REGISTER = "actions must be active arms of this service: register them with POST /v1/arms"
RENAMED = {"event_id": "eventId", "defer": "deferActivation", "baseline_arm": "actions"}


@dataclass(frozen=True)
class Fields:
    """Where each part of a `SelectRequest` came from in the Rank request."""

    context: Merged  # the merged contextFeatures
    candidates: tuple[int, ...]  # the action index of each of the request's `arms`
    actions: Mapping[str, int]  # action id -> its index
    features: Mapping[str, Merged]  # arm id -> its merged features, when used

    def target(self, field: str) -> str:
        """rofu's field as the Rank request's (`arms.1` -> `actions.2.id`)."""
        head, _, rest = field.partition(".")
        if head == "context":
            return "contextFeatures" + self.context.located(rest)
        if head == "arms":
            return f"actions.{self.candidates[int(rest)]}.id" if rest.isdigit() else "actions"
        if head == "arm_features":
            arm = max(
                (a for a in self.features if f"{rest}.".startswith(f"{a}.")), key=len, default=None
            )
            if arm is None:
                return "actions"
            below = self.features[arm].located(rest[len(arm) + 1 :])
            return f"actions.{self.actions[arm]}.features{below}"
        return RENAMED.get(field, field)

    def translated(self, error: ServiceError) -> ServiceError:
        """`error` with its field and message in the Rank request's terms."""
        if error.field is None:
            return error
        field = self.target(error.field)
        message = error.message
        if message.startswith(error.field):
            message = field + message[len(error.field) :]
        if error.field.startswith("arms"):
            message += f" ({REGISTER})"
        return _with(error, field, message)


@dataclass(frozen=True)
class Translation:
    """A Rank request as a `SelectRequest`, and how to name rofu's fields in its terms."""

    request: SelectRequest
    fields: Fields


def translate(body: RankRequest, settings: Settings) -> Translation:
    """The `SelectRequest` of a Rank request (see the module docstring).

    Raises:
        InvalidInput: what rofu cannot take, naming the Rank request's field.
    """
    ids = [action.id for action in body.actions]
    excluded = _excluded(body.excluded_actions or [], ids)
    candidates = tuple(j for j, arm_id in enumerate(ids) if arm_id not in excluded)
    if not candidates:
        raise InvalidInput(
            "excludedActions: every action is excluded; leave at least one",
            field="excludedActions",
        )
    _check_ids(ids, candidates)
    context = merge(body.context_features or [], "contextFeatures")
    used: dict[str, Merged] = {}
    for j, action in enumerate(body.actions):
        merged = merge(action.features, f"actions.{j}.features")  # validated even if unused
        if action.id not in excluded and action.features and settings.arm_feature_dim:
            used[action.id] = merged
    fields = Fields(context, candidates, {arm_id: j for j, arm_id in enumerate(ids)}, used)
    request: dict[str, object] = {
        "context": context.named,
        "event_id": body.event_id,
        "arms": [ids[j] for j in candidates],
        "defer": body.defer_activation,
        "arm_features": {arm_id: merged.named for arm_id, merged in used.items()} or None,
    }
    if settings.learning_mode == "apprentice":  # Personalizer's baseline: the first action
        request["baseline_arm"] = ids[candidates[0]]
    try:
        return Translation(SelectRequest.model_validate(request), fields)
    except ValidationError as exc:  # checked above; named in the request's terms anyway
        first = exc.errors()[0]
        field = fields.target(".".join(str(part) for part in first["loc"]))
        raise InvalidInput(f"{field}: {first['msg']}", field=field) from exc


def _excluded(excluded: Sequence[str], ids: Sequence[str]) -> set[str]:
    """The excluded ids, each an action's.

    Raises:
        InvalidInput: an excluded id that is no action's.
    """
    known = set(ids)
    for k, arm_id in enumerate(excluded):
        if arm_id not in known:
            raise InvalidInput(
                f"excludedActions.{k}: {arm_id[:140]!r} is not the id of one of actions",
                field=f"excludedActions.{k}",
            )
    return set(excluded)


def _check_ids(ids: Sequence[str], candidates: Sequence[int]) -> None:
    """Refuse a repeated action id, and a candidate's that cannot be an arm id.

    Raises:
        InvalidInput: naming the action (`actions.2.id`).
    """
    first: dict[str, int] = {}
    for j, arm_id in enumerate(ids):
        where = f"actions.{j}.id"
        if arm_id in first:
            raise InvalidInput(
                f"{where}: {arm_id[:140]!r} repeats actions.{first[arm_id]}.id; action ids "
                "are unique",
                field=where,
            )
        first[arm_id] = j
    for j in candidates:
        if not re.fullmatch(ARM_ID_PATTERN, ids[j]):
            raise InvalidInput(
                f"actions.{j}.id: {ids[j][:140]!r} is not an arm id (1-128 characters of "
                f"[A-Za-z0-9_.:-]); {REGISTER}",
                field=f"actions.{j}.id",
            )


def ranking(body: RankRequest, decision: SelectResponse) -> RankResponse:
    """The Rank response of `decision`, made for `body`: every action, the chosen first.

    Raises:
        Conflict: the decision was logged before rofu stored probabilities.
    """
    if decision.probabilities is None:
        raise Conflict(
            f"eventId {decision.event_id!r} names a decision logged before rofu stored "
            "every candidate's probability: it has no ranking; use another eventId",
            field="eventId",
        )
    probability = {p.arm: p.probability for p in decision.probabilities}
    ids = [action.id for action in body.actions]
    order = sorted(
        range(len(ids)),
        key=lambda j: (ids[j] != decision.arm, -probability.get(ids[j], 0.0), j),
    )
    ranked = [RankedAction(id=ids[j], probability=probability.get(ids[j], 0.0)) for j in order]
    return RankResponse(ranking=ranked, event_id=decision.event_id, reward_action_id=decision.arm)


async def rank(
    body: RankRequest,
    settings: Settings,
    batcher: MicroBatcher[Pending, Result],
    metrics: ServiceMetrics,
) -> RankResponse:
    """Personalizer's Rank, decided by `rofu.service.deciding.select.decide` like /v1/select."""
    translation = translate(body, settings)
    try:
        decision = await decide(translation.request, settings, batcher, metrics)
    except ServiceError as exc:
        raise translation.fields.translated(exc) from exc
    return ranking(body, decision)


async def reward(
    event_id: str,
    value: float,
    settings: Settings,
    rewards: RewardBatcher,
    metrics: ServiceMetrics,
) -> RewardOutcome:
    """Personalizer's Reward, stored by `rofu.service.rewards.record.record_reward` like
    /v1/reward, except that another value for a rewarded event is accepted and ignored (the
    first value is kept; the repeat is counted), as Personalizer took every reward post."""
    _check_event_id(event_id)
    try:
        return await record_reward(event_id, value, settings, rewards, metrics, keep_first=True)
    except ServiceError as exc:
        raise _renamed(exc) from exc


async def activate_event(
    event_id: str, settings: Settings, sessions: SessionFactory, metrics: ServiceMetrics
) -> Activation:
    """Personalizer's Activate, by `rofu.service.rewards.activation.activate` like /v1's."""
    _check_event_id(event_id)
    try:
        return await activate(event_id, settings, sessions, metrics)
    except ServiceError as exc:
        raise _renamed(exc) from exc


def _check_event_id(event_id: str) -> None:
    if not re.fullmatch(EVENT_ID_PATTERN, event_id):
        raise InvalidInput(f"eventId: {event_id[:140]!r} {EVENT_ID_RULE}", field="eventId")


def _renamed(error: ServiceError) -> ServiceError:
    """An event's error with `event_id` named `eventId`."""
    if error.field != "event_id":
        return error
    return _with(error, "eventId", re.sub(r"\bevent_id\b", "eventId", error.message))


def _with(error: ServiceError, field: str, message: str) -> ServiceError:
    """A copy of `error` (its class, status and headers) with another field and message."""
    renamed = copy.copy(error)
    renamed.field, renamed.message, renamed.args = field, message, (message,)
    return renamed
