"""Base model for the RLJob API: camelCase on the wire, strict about unknown fields.

The CRD's OpenAPI schema is generated from these models, so `extra="forbid"` here is what
makes the API server (and local mode) reject a misspelt field instead of dropping it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The dict as it is stored in Kubernetes: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
