"""The recipe reference of ``docs/recipes.md``, rendered from the recipe's JSON Schema: after changing
a recipe model, ``python tools/recipe_reference.py docs/recipes.md`` rewrites the block between
:data:`BEGIN` and :data:`END` (``tests/unit/test_docs_reference.py`` fails while they disagree).
``strategy`` and ``cluster`` get one table per built-in kind, from each kind's config class.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from kerasdist.config.cluster_configs import cluster_config_classes
from kerasdist.config.loader import json_schema
from kerasdist.config.source_configs import source_config_classes
from kerasdist.config.strategy_configs import strategy_config_classes

BEGIN = "<!-- BEGIN GENERATED: recipe reference; python tools/recipe_reference.py docs/recipes.md -->"
"""The line that opens the generated block."""
END = "<!-- END GENERATED: recipe reference -->"
"""The line that closes the generated block."""

_HEADER = "| field | type / allowed values | default | description |\n| --- | --- | --- | --- |"
_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
           ("exclusiveMaximum", "<"))


def recipe_reference_markdown() -> str:
    """Render the recipe reference: one table per recipe section (nested sections are rows of
    their parent's), one row per field: dotted path, type or allowed values with bounds, default
    and description, all from the JSON Schema.

    Returns:
        Markdown text (no markers), ending with a newline.
    """
    schema = json_schema()
    defs = schema.get("$defs", {})
    parts = []
    for section, prop in schema["properties"].items():
        if section in ("strategy", "cluster"):
            parts.append(_kinds_section(section, prop))
            continue
        sub = _resolve(prop, defs)
        if not sub.get("properties"):  # a top-level field that is not a section (callbacks)
            default = _value(prop["default"]) if "default" in prop else (
                "`[]`" if prop.get("type") == "array" else "")  # a list's default_factory
            row = _row(section, _type(prop), default, "see above")
            parts.append(f"### `{section}`\n\n{_text(prop.get('description', ''))}\n\n"
                         f"{_HEADER}\n{row}")
            continue
        parts.append(f"### `{section}`\n\n{_text(sub.get('description', ''))}\n\n{_HEADER}\n"
                     + "\n".join(_rows(section, sub, defs, prop.get("default") or {})))
        if section == "data":
            parts.append(_source_section())
    return "\n\n".join(parts) + "\n"


def _source_section() -> str:
    """One table per built-in ``data.source`` kind (its fields beside ``kind``)."""
    parts = []
    for kind, cls in source_config_classes().items():
        sub = cls.model_json_schema()
        rows = _rows("data.source", sub, sub.get("$defs", {}), {}, skip=("kind",))
        table = f"{_HEADER}\n" + "\n".join(rows) if rows else "No other fields."
        parts.append(f"#### `data.source.kind: {kind}`\n\n{_text(sub.get('description', ''))}"
                     f"\n\n" + table)
    return "\n\n".join(parts)


def _kinds_section(section: str, prop: dict[str, Any]) -> str:
    """One table per built-in kind of a kinded section (``strategy``, ``cluster``)."""
    classes = strategy_config_classes() if section == "strategy" else cluster_config_classes()
    kinds = {kind: cls for kind, cls in classes.items()
             if cls.__module__.startswith("kerasdist.")}  # not kinds registered by tests or users
    default = (prop.get("default") or {}).get("kind", "")
    what = "strategy runs the recipe" if section == "strategy" else "cluster runs its tasks"
    row = _row(f"{section}.kind", " · ".join(f"`{k}`" for k in kinds), _value(default),
               f"Which {what}; the other `{section}.*` fields depend on it (one table per kind "
               "below).")
    parts = [f"### `{section}`\n\n{_HEADER}\n{row}"]
    for kind, cls in kinds.items():
        sub = cls.model_json_schema()
        rows = _rows(section, sub, sub.get("$defs", {}), {}, skip=("kind",))
        table = f"{_HEADER}\n" + "\n".join(rows) if rows else "No other fields."
        parts.append(f"#### `{section}.kind: {kind}`\n\n{_text(sub.get('description', ''))}\n\n"
                     + table)
    return "\n\n".join(parts)


def _rows(prefix: str, schema: dict[str, Any], defs: dict[str, Any], defaults: dict[str, Any],
          skip: tuple[str, ...] = ()) -> list[str]:
    """One row per field of ``schema``; a nested section adds a row and then its own fields."""
    rows = []
    for name, prop in schema.get("properties", {}).items():
        if name in skip:
            continue
        path = f"{prefix}.{name}"
        if path == "data.source":  # one table per kind follows
            kinds = " · ".join(f"`{k}`" for k in source_config_classes())
            rows.append(_row(f"{path}.kind", kinds, _value((prop.get("default") or {}).get(
                "kind")), prop.get("description", "")))
            continue
        nested = _resolve(prop, defs)
        optional = [_resolve(o, defs) for o in prop.get("anyOf", ()) if "$ref" in o]
        if len(optional) == 1 and optional[0].get("properties"):  # a section that may be null
            rows.append(_row(path, "section or null", _value(prop.get("default")),
                             f"{prop.get('description', '')} "
                             f"{optional[0].get('description', '')}"))
            rows.extend(_rows(path, optional[0], defs, {}))
            continue
        if nested.get("properties"):
            rows.append(_row(path, "section", "", nested.get("description", "")))
            rows.extend(_rows(path, nested, defs, prop.get("default") or {}))
            continue
        if "default" in prop:
            default = _value(prop["default"])
        elif name in defaults:  # a default_factory: the schema has it in the parent's default
            default = _value(defaults[name])
        else:
            default = "required" if name in schema.get("required", ()) else ""
        rows.append(_row(path, _type(prop), default, prop.get("description", "")))
    return rows


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref", "")
    return defs[ref.rsplit("/", 1)[-1]] if ref.startswith("#/$defs/") else prop


_REF_NAMES = {"KerasConfig": "`{class_name, config}`", "TrackingConfig": "section (below)"}
"""How a field holding a nested model (a JSON Schema ``$ref``) is named in the type column."""


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return _REF_NAMES.get(name, f"`{name}`")
    if "anyOf" in prop:
        return " or ".join(_type(option) for option in prop["anyOf"])
    if "const" in prop:
        return _value(prop["const"])
    if "enum" in prop:
        text = " · ".join(_value(v) for v in prop["enum"])
    elif prop.get("type") == "array":
        text = f"list of {_type(prop.get('items', {}))}"
    elif prop.get("type") == "object":
        text = "mapping"
    else:
        text = prop.get("format") or prop.get("type", "any")
    bounds = [f"{sign} {prop[key]}" for key, sign in _BOUNDS if key in prop]
    if prop.get("minLength"):
        bounds.append("non-empty" if prop["minLength"] == 1 else f"length >= {prop['minLength']}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _value(value: Any) -> str:
    """A default or an allowed value as it is written in YAML."""
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return "`null`" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _text(text: str) -> str:
    """reStructuredText inline markup (``x``, :mod:`x`) as Markdown."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _row(path: str, kind: str, default: str, description: str) -> str:
    cells = [f"`{path}`", kind, default or "–", _text(" ".join(description.split())) or "–"]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def write_reference(path: str | Path) -> bool:
    """Replace the generated block of ``path`` (between :data:`BEGIN` and :data:`END`).

    Args:
        path: a Markdown file holding both marker lines, e.g. ``docs/recipes.md``.

    Returns:
        True if the file changed, False if it already held the current reference.

    Raises:
        ValueError: the file lacks a marker, or they come in the wrong order.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: needs the lines {BEGIN!r} and then {END!r}")
    new = text[:start + len(BEGIN)] + "\n\n" + recipe_reference_markdown() + "\n" + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "docs/recipes.md"
    print(f"{target}: {'updated' if write_reference(target) else 'already current'}")
