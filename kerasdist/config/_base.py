"""The frozen pydantic base every recipe section derives from."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Forbids unknown keys, frozen after validation, validates defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
