"""The frozen pydantic base every recipe section derives from."""

from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError


def _admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold ``True``/``False`` (``bool``, ``Any``, a union or
    ``Literal`` that names one); pydantic's lax mode would otherwise read them as 1 and 0."""
    if annotation in (bool, Any) or isinstance(annotation, bool):
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return any(isinstance(arg, bool) for arg in get_args(annotation))
    if origin is Union or str(origin) in ("types.UnionType", "<class 'types.UnionType'>") or \
            getattr(origin, "__name__", "") == "Annotated":
        return any(_admits_bool(arg) for arg in get_args(annotation))
    return origin is not None and not get_args(annotation)


class Frozen(BaseModel):
    """Forbids unknown keys, frozen after validation, validates defaults; a boolean is refused
    where a number is expected (``epochs: true`` is not 1 epoch)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if isinstance(value, bool) and field is not None and \
                        not _admits_bool(field.annotation):
                    raise PydanticCustomError(
                        "bool_for_number", "must be a number or text, not a boolean "
                        "(true/false). Received: {field}={value}",
                        {"field": name, "value": str(value).lower()})
        return data
