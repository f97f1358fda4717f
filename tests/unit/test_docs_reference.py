"""The recipe reference in docs/recipes.md is the one generated from the schema, and it covers the
whole schema: a field added, renamed or re-described without regenerating the block fails here
(regenerate with ``python tools/recipe_reference.py docs/recipes.md``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kerasdist.config import json_schema
from kerasdist.config.strategy_configs import strategy_config_classes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from recipe_reference import BEGIN, END, recipe_reference_markdown, write_reference  # noqa: E402

DOC = ROOT / "docs" / "recipes.md"


def _block() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{DOC}: one pair of markers expected"
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert start <= end, f"{DOC}: the END marker comes before BEGIN"
    return text[start:end]


def _leaves(prefix: str, schema: dict, defs: dict) -> list[str]:
    """Dotted paths of every leaf field below ``schema`` (nested sections followed by $ref)."""
    paths = []
    for name, prop in schema.get("properties", {}).items():
        if "oneOf" in prop:  # strategy: one variant per kind, walked from each kind's class below
            continue
        ref = prop.get("$ref", "")
        nested = defs[ref.rsplit("/", 1)[-1]] if ref else prop
        if nested.get("properties"):
            paths += _leaves(f"{prefix}.{name}", nested, defs)
        else:
            paths.append(f"{prefix}.{name}")
    return paths


def _schema_sections_and_leaves() -> tuple[list[str], list[str]]:
    schema = json_schema()
    sections, leaves = list(schema["properties"]), []
    for section in sections:
        leaves += _leaves("", {"properties": {section: schema["properties"][section]}},
                          schema.get("$defs", {}))
    for cls in strategy_config_classes().values():
        if cls.__module__.startswith("kerasdist."):
            sub = cls.model_json_schema()
            leaves += _leaves("strategy", sub, sub.get("$defs", {}))
    return sections, sorted({leaf.lstrip(".") for leaf in leaves})


def test_the_reference_in_docs_is_the_one_generated_from_the_schema():
    assert _block().strip() == recipe_reference_markdown().strip(), (
        "docs/recipes.md's recipe reference differs from the schema; regenerate it with "
        "`python tools/recipe_reference.py docs/recipes.md`")


def test_every_section_and_every_leaf_field_of_the_schema_has_a_row():
    block = _block()
    sections, leaves = _schema_sections_and_leaves()
    assert {"model", "data", "optimizer", "strategy", "cluster", "trainer", "output"} <= set(sections)
    assert "trainer.checkpoint.every_steps" in leaves and "strategy.logical_cpus" in leaves
    missing_sections = [s for s in sections if f"\n### `{s}`\n" not in block]
    missing_fields = [leaf for leaf in leaves if f"\n| `{leaf}` |" not in block]
    assert not missing_sections and not missing_fields, (missing_sections, missing_fields)


def test_write_reference_replaces_only_the_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{BEGIN}\nstale\n{END}\n\nafter\n", encoding="utf-8")
    assert write_reference(page) is True
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert "stale" not in text and recipe_reference_markdown() in text
    assert write_reference(page) is False
    (tmp_path / "bare.md").write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs the lines"):
        write_reference(tmp_path / "bare.md")
