"""Loading recipes: YAML in, a validated frozen :class:`Recipe` out, or one clear RecipeError.

This is the only place raw dicts exist; everything below it receives typed config objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pydantic
import yaml

from kerasdist.config.schema import Recipe
from kerasdist.errors import RecipeError


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Read, override and validate a YAML recipe.

    Args:
        path: the recipe file.
        overrides: ``"a.b=c"`` strings (the CLI's ``--set``); ``c`` is parsed as YAML, so
            ``trainer.epochs=3`` gives an int and ``data.eval_split=null`` gives None.

    Returns:
        The validated, frozen :class:`Recipe`.

    Raises:
        RecipeError: missing/unreadable file, malformed YAML (with ``file:line:column``), a bad
            override, or a validation error naming the dotted field path and the received value.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise RecipeError(f"cannot read recipe file '{path}': {err.strerror}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise RecipeError(f"{where}: malformed YAML: {err.problem or err}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping. Received: {type(raw).__name__}")
    raw = apply_overrides(raw, overrides)
    return validate_recipe(raw, source=str(path), text=text)


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``dotted.key=yaml_value`` applied.

    Raises:
        RecipeError: an override without ``=``, or one that descends into a non-mapping.
    """
    result = _deep_copy(raw)
    for item in overrides:
        key, sep, value_text = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set expects KEY=VALUE (e.g. trainer.epochs=3). Received: '{item}'")
        try:
            value = yaml.safe_load(value_text) if value_text.strip() else ""
        except yaml.YAMLError:
            value = value_text
        node = result
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                dotted = ".".join(parts[: depth + 1])
                raise RecipeError(f"--set {key}: '{dotted}' is not a section. Received: {child!r}")
            node = child
        node[parts[-1]] = value
    return result


def validate_recipe(raw: dict[str, Any], *, source: str = "<recipe>", text: str | None = None) -> Recipe:
    """Validate a recipe mapping; errors name ``source:line:col`` where the YAML text is known."""
    try:
        return Recipe.model_validate(raw)
    except pydantic.ValidationError as err:
        raise RecipeError(format_validation_error(err, source=source, text=text)) from None


def format_validation_error(err: pydantic.ValidationError, *, source: str, text: str | None) -> str:
    """One line per problem: ``file:line:col: dotted.path: message. Received: value``."""
    marks = _key_marks(text) if text else {}
    lines = []
    for item in err.errors(include_url=False):
        loc = _clean_loc(item["loc"])
        dotted = ".".join(str(p) for p in loc) or "(recipe)"
        where = source
        for cut in range(len(loc), 0, -1):
            mark = marks.get(tuple(str(p) for p in loc[:cut]))
            if mark:
                where = f"{source}:{mark[0]}:{mark[1]}"
                break
        if item["type"] == "union_tag_invalid":
            dotted += "." + str(item.get("ctx", {}).get("discriminator", "kind")).strip("'")
        message = _message(item)
        # Value errors raised by our validators already name their field.
        lines.append(f"{where}: {message}" if item["type"] == "value_error" else
                     f"{where}: {dotted}: {message}")
    return "invalid recipe\n  " + "\n  ".join(lines)


def _message(item: dict[str, Any]) -> str:
    kind, msg = item["type"], item["msg"]
    if kind == "extra_forbidden":
        return "unknown key (not part of the recipe schema; check the spelling)"
    if kind == "union_tag_invalid":
        ctx = item.get("ctx", {})
        return f"unknown value {ctx.get('tag')!r}; available: {ctx.get('expected_tags')}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    received = item.get("input")
    return f"{msg}. Received: {received!r}"


def _clean_loc(loc: tuple) -> tuple:
    # The strategy section is validated by kind (no union tag in the path); keep the path as is.
    return tuple(loc)


def _key_marks(text: str) -> dict[tuple[str, ...], tuple[int, int]]:
    """Map each key path of the YAML text to the (line, column) of its key, 1-based."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    marks: dict[tuple[str, ...], tuple[int, int]] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                path = prefix + (str(key_node.value),)
                marks[path] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                walk(value_node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, child in enumerate(node.value):
                path = prefix + (str(index),)
                marks[path] = (child.start_mark.line + 1, child.start_mark.column + 1)
                walk(child, path)

    walk(root, ())
    return marks


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe (every default filled in) as YAML text."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe, for editors (e.g. the YAML language server)."""
    return Recipe.model_json_schema()
