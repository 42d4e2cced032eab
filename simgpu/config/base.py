"""The base of every configuration model: strict, frozen, documented pydantic models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """A configuration section: unknown keys are rejected, values are not coerced loosely."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, validate_default=True)
