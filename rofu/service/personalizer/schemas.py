"""The Personalizer-compatible facade's bodies and error shape (Azure Personalizer v1.0).

Field names, shapes and status codes follow Personalizer's public REST reference
(`Azure/azure-rest-api-specs`, `specification/cognitiveservices/data-plane/Personalizer/
stable/v1.0`): `RankRequest`, `RankableAction`, `RankResponse`, `RankedAction`,
`RewardRequest` and `ErrorResponse` (here `PersonalizerRewardRequest` and
`PersonalizerErrorResponse`, beside rofu's own). Requests are strict: numbers and booleans
must be JSON ones, and a field the v1.0 schema does not define is refused (400 naming it).

Every error of the facade's paths, rofu's own included (a missing key, a body too large,
an unknown path, a database outage), is reshaped by `reshape` into Personalizer's
`{"error": {"code", "message", "target", "innerError": {"code"}}}`: `code` is the one
Personalizer answered with (`error_code`), `target` the offending field, `innerError.code`
rofu's own code (`unauthorized`, `conflict`, `unavailable`, ...). The status is rofu's,
except that a 422 is a 400, as Personalizer answers; headers (`Retry-After`,
`WWW-Authenticate`, `Allow`) are kept.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError
from starlette.responses import JSONResponse, Response

from rofu.client.schemas import EVENT_ID_PATTERN

PREFIX = "/personalizer/v1.0"
SERVED = (
    f"rofu's Personalizer-compatible API has POST {PREFIX}/rank, "
    f"{PREFIX}/events/{{eventId}}/reward and {PREFIX}/events/{{eventId}}/activate, and no "
    "configuration, evaluation, model or log endpoints"
)
EVENT_ID_RULE = (
    "is not a rofu event id: 1-128 characters of [A-Za-z0-9_.:-] starting with a letter or "
    "a digit (a GUID fits; Personalizer allowed any 256 characters)"
)


def is_facade(path: str) -> bool:
    """Whether a request path is the facade's (its errors take Personalizer's shape)."""
    return path == PREFIX or path.startswith(f"{PREFIX}/")


def checked_event_id(value: str) -> str:
    """`value` if it is a rofu event id.

    Raises:
        PydanticCustomError: naming the rule (`EVENT_ID_RULE`).
    """
    if not re.fullmatch(EVENT_ID_PATTERN, value):
        raise PydanticCustomError(
            "event_id", "{value} " + EVENT_ID_RULE, {"value": repr(value[:140])}
        )
    return value


class _Camel(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


FeatureObjects = list[dict[str, Any]]


class RankableAction(_Camel):
    """An action to rank: its id (a registered arm unless excluded) and its features."""

    id: str = Field(
        min_length=1,
        max_length=256,
        description="The action's id: an active arm of rofu's catalogue (POST /v1/arms), "
        "unless excluded",
    )
    features: FeatureObjects = Field(
        description="Objects of named features, merged into one (see the README); used "
        "by an arm-feature model, ignored by one with an output per arm"
    )


class RankRequest(_Camel):
    """Personalizer's Rank request."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "contextFeatures": [{"timeOfDay": "Morning"}, {"device": {"mobile": True}}],
                    "actions": [
                        {"id": "arm-0", "features": [{"type": "News"}]},
                        {"id": "arm-1", "features": [{"type": "Sports"}]},
                        {"id": "arm-2", "features": [{"type": "Entertainment"}]},
                    ],
                    "excludedActions": ["arm-1"],
                    "deferActivation": False,
                }
            ]
        }
    )

    context_features: FeatureObjects | None = Field(
        default=None,
        description="Objects of named features (a key whose value is an object is a "
        "namespace), merged into one named context and hashed into context_dim",
        examples=[[{"timeOfDay": "Morning"}]],
    )
    actions: list[RankableAction] = Field(min_length=1, description="The actions to rank")
    excluded_actions: list[str] | None = Field(
        default=None, description="Ids of actions that must not be chosen (probability 0)"
    )
    event_id: (
        Annotated[
            str,
            AfterValidator(checked_event_id),
            Field(
                json_schema_extra={"pattern": EVENT_ID_PATTERN},
                description="Idempotency key: the same id and body give the same ranking; "
                "generated when omitted",
            ),
        ]
        | None
    ) = None
    defer_activation: bool = Field(
        default=False,
        description="True: trained on only once POST .../events/{eventId}/activate "
        "activates it within the reward window",
    )


class RankedAction(_Camel):
    """An action of the ranking and its exact probability of being chosen."""

    id: str
    probability: float = Field(ge=0, le=1)


class RankResponse(_Camel):
    """Personalizer's Rank response: the chosen action first, then the others."""

    ranking: list[RankedAction]
    event_id: str
    reward_action_id: str = Field(description="The chosen action: show it, reward it")


class PersonalizerRewardRequest(_Camel):
    """Personalizer's RewardRequest."""

    value: float = Field(
        allow_inf_nan=False,
        description="The reward: any finite number within ROFU_MAX_ABS_REWARD "
        "(Personalizer's -1..1 included)",
        examples=[1.0],
    )


class InternalError(BaseModel):
    """rofu's own error code, under Personalizer's one."""

    code: str


#: Personalizer's codes by status (Personalizer's own error codes, and "401", which Azure's
#: gateway in front of it answered for a missing or wrong key); a 409 is Rank's (an eventId
#: reused for another request), other 4xx are BadRequest and 5xx InternalServerError.
STATUS_CODES = {
    401: "401",
    404: "ResourceNotFound",
    409: "InvalidRankRequest",
    413: "PayloadSizeExceeded",
}
ErrorCode = Literal[
    "BadRequest",
    "401",
    "ResourceNotFound",
    "InvalidRankRequest",
    "PayloadSizeExceeded",
    "InternalServerError",
]


class PersonalizerError(BaseModel):
    """Personalizer's error object."""

    code: ErrorCode
    message: str
    target: str | None = Field(default=None, description="The offending field")
    inner_error: InternalError | None = Field(default=None, alias="innerError")


class PersonalizerErrorResponse(BaseModel):
    """Personalizer's ErrorResponse: the body of every error of the facade."""

    error: PersonalizerError


ERRORS: dict[int | str, dict[str, Any]] = {
    "default": {
        "model": PersonalizerErrorResponse,
        "description": "An error, in Personalizer's shape",
    }
}


def error_code(status: int) -> str:
    """Personalizer's code for an HTTP status (`STATUS_CODES`)."""
    return STATUS_CODES.get(status) or ("InternalServerError" if status >= 500 else "BadRequest")


def reshape(response: Response, path: str = "") -> JSONResponse:
    """rofu's error response (`rofu.service.errors.error_response`) to a request for `path`, in
    Personalizer's shape."""
    error = json.loads(bytes(response.body))["error"]
    status = 400 if response.status_code == 422 else response.status_code
    message = error["message"]
    if status == 404 and not error.get("field"):  # no such route: say which exist
        message = f"{path} is not served: {SERVED}"
    body: dict[str, Any] = {"code": error_code(status), "message": message}
    if error.get("field"):
        body["target"] = error["field"]
    body["innerError"] = {"code": error["code"]}
    headers = {
        name: value
        for name, value in response.headers.items()
        if name not in ("content-length", "content-type")
    }
    return JSONResponse({"error": body}, status_code=status, headers=headers)
