"""Base model for the RLJob API: camelCase on the wire, strict about unknown fields.

The CRD's OpenAPI schema is generated from these models, so `extra="forbid"` here is what
makes the API server (and local mode) reject a misspelt field instead of dropping it.

Two input rules make local mode decide like the API server (found by the generated specs of
tests/reliability/test_generated_specs.py):

* a `null` for a field that does not admit null is dropped (the field keeps its default), as
  the API server prunes nulls of non-nullable fields before it validates and defaults;
* a boolean is never a number: pydantic would read `true` as 1, the API server refuses it.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel


def _admits_none(annotation: Any) -> bool:
    return annotation is None or annotation is type(None) or type(None) in typing.get_args(annotation)


def _numeric(annotation: Any) -> bool:
    """int or float (or Optional of one), and not bool."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if typing.get_origin(annotation) is typing.Union:
        args = typing.get_args(annotation)
    return any(a in (int, float) for a in args) and bool not in args


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _as_the_api_server_reads_it(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        field = cls.model_fields[info.field_name]
        if value is None and not field.is_required() and not _admits_none(field.annotation):
            return field.get_default(call_default_factory=True)
        if isinstance(value, bool) and _numeric(field.annotation):
            raise ValueError("must be a number, not a boolean")
        return value

    def to_wire(self) -> dict[str, Any]:
        """The dict as it is stored in Kubernetes: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
