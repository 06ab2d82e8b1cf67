"""The service's side of the v1 API's bodies: the wire schemas are `rofu.client.schemas`
(the OpenAPI schema is generated from them); here is what only the service checks.

A /v1/select request's features are validated the service's way: a dense vector as
strict, finite float32 numbers, a named object by `rofu.service.deciding.features`, whose
errors name the offending key (`context.user.age`). Their lengths are checked later,
against the settings (`rofu.service.deciding.select.vectors`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, WrapValidator
from pydantic_core import InitErrorDetails, PydanticCustomError

from rofu.client.schemas import ErrorResponse, Feature, NamedContext, SelectFields
from rofu.service.deciding import features

_DENSE: TypeAdapter[list[float]] = TypeAdapter(list[Feature], config=ConfigDict(strict=True))


def _dense_or_named(value: Any, _handler: Any) -> list[float] | dict[str, object]:
    """A dense list of numbers, or a named object validated by
    `rofu.service.deciding.features` (whose errors name the offending key)."""
    if isinstance(value, dict):
        try:
            return features.normalise(value, path="")
        except features.FeatureError as exc:
            error = PydanticCustomError("named_feature", "{reason}", {"reason": exc.reason})
            detail = InitErrorDetails(type=error, loc=exc.loc, input=value)
            raise ValidationError.from_exception_data("named features", [detail]) from exc
    if isinstance(value, list):
        return _DENSE.validate_python(value)
    raise PydanticCustomError(
        "features_type", "Input should be an array of numbers or an object of named features"
    )


Features = Annotated[list[Feature] | NamedContext, WrapValidator(_dense_or_named)]


class SelectRequest(SelectFields[Features]):
    """Which arm should this context get?"""


class HealthResponse(BaseModel):
    """Liveness or readiness."""

    status: str
    checks: dict[str, str] = Field(default_factory=dict)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting the error body for each status code."""
    return {code: {"model": ErrorResponse} for code in codes}
