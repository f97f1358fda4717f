"""The frozen pydantic base every recipe section derives from, and the registry of a section
chosen by its ``kind``."""

from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, SerializeAsAny, model_validator
from pydantic_core import PydanticCustomError

from kerasdist.errors import RecipeError


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


class KindedSection:
    """The config classes of a recipe section chosen by its ``kind`` (``strategy``, ``cluster``):
    one frozen class per kind, registered by the ``kind`` literal's default.

    Args:
        section: the section's name in recipes and messages.
        base: the class every kind's class derives from.
        traits: the class of the ``traits`` each kind's class declares.
        classes: the built-in kinds' classes.
        default: the kind of a section given without ``kind`` (or not given).
        what: the kind in words, for the unknown-kind message (``"strategy"``).
        check: ``check(kind, value)`` before a mapping is validated (raises ValueError).
    """

    def __init__(self, section: str, base: type[Frozen], traits: type, classes, *, default: str,
                 what: str, check=None):
        self.section, self.base, self.traits, self.default, self.what, self._check = (
            section, base, traits, default, what, check)
        self._classes: dict[str, type[Frozen]] = {}
        for cls in classes:
            self.register(cls)

    def classes(self) -> dict[str, type[Frozen]]:
        """``{kind: config class}`` of every kind recipes accept."""
        return dict(self._classes)

    def register(self, config_class: type[Frozen]) -> None:
        """Make ``<section>.kind: <config_class's kind default>`` valid in recipes (a later
        registration of the same kind replaces it).

        Raises:
            RecipeError: the class does not derive from ``base``, gives ``kind`` no string
                default or declares no ``traits``.
        """
        kind = getattr(config_class.model_fields.get("kind"), "default", None)
        if not (isinstance(config_class, type) and issubclass(config_class, self.base)
                and isinstance(kind, str)
                and isinstance(getattr(config_class, "traits", None), self.traits)):
            raise RecipeError(f"a {self.section} config class must subclass "
                              f"{self.base.__name__}, give `kind` a string default and declare "
                              f"`traits`. Received: {config_class!r}")
        self._classes[kind] = config_class

    def validate(self, value: Any) -> Any:
        """The section's value as its kind's config class (a pydantic before-validator).

        Raises:
            ValueError: not a mapping; an unknown kind (lists the known ones); what ``check``
                refuses.
        """
        if isinstance(value, self.base):
            return value
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"{self.section} must be a mapping with a 'kind'. Received: {value!r}")
        kind = value.get("kind", self.default)
        if kind not in self._classes:
            raise ValueError(f"{self.section}.kind: unknown {self.what} '{kind}'. Available: "
                             f"{', '.join(repr(k) for k in sorted(self._classes))}. "
                             f"Received: kind={kind!r}")
        if self._check is not None:
            self._check(kind, value)
        return self._classes[kind].model_validate(value)

    def annotated(self):
        """The section field's type: validated by ``kind`` into one of the registered classes."""
        return Annotated[SerializeAsAny[self.base], BeforeValidator(self.validate)]
