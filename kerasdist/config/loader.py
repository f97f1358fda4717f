"""Loading recipes: YAML in, a validated frozen :class:`Recipe` out, or one clear RecipeError.

This is the only place raw dicts exist; everything below it receives typed config objects.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import pydantic
import yaml

from kerasdist.config.schema import Recipe
from kerasdist.errors import RecipeError


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Read, override and validate a YAML recipe, parsed within :data:`MAX_RECIPE_BYTES`,
    :data:`MAX_DEPTH` and :data:`MAX_NODES` (a hostile file fails quickly, in bounded memory).

    Args:
        path: the recipe file.
        overrides: ``"a.b=c"`` strings (the CLI's ``--set``); ``c`` is parsed as YAML, so
            ``trainer.epochs=3`` gives an int and ``data.eval_split=null`` gives None.

    Returns:
        The validated, frozen :class:`Recipe`.

    Raises:
        RecipeError: missing/unreadable/non-UTF-8 file, malformed YAML (``file:line:column``),
            a document over the limits, a repeated key, a bad override, or a validation error
            naming the dotted field path and the received value.
    """
    path = Path(path)
    text = read_recipe_text(path)
    raw = parse_yaml(text, source=str(path))
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping. Received: {type(raw).__name__}")
    raw = apply_overrides(raw, overrides)
    return validate_recipe(raw, source=str(path), text=text)


MAX_RECIPE_BYTES = 4 << 20
"""A recipe is a small config file; larger files are refused before parsing."""
MAX_DEPTH = 64
"""Deepest nesting of sequences/mappings a recipe may have (real recipes use about 4)."""
MAX_NODES = 100_000
"""Most YAML nodes a recipe may expand to, counting every alias use as a full copy of its anchor's
subtree (an alias bomb is refused long before it could be built, copied or validated)."""


class _LimitExceeded(yaml.MarkedYAMLError):
    """A YAML document over :data:`MAX_DEPTH` or :data:`MAX_NODES` (or a recursive alias), or
    one that repeats a key of a mapping (:class:`_DuplicateKey`): refused, never read on."""


class _DuplicateKey(_LimitExceeded):
    """A mapping that names the same key twice (YAML would keep the last one silently)."""


class _NotYAML(Exception):
    """An ``--set`` value that is not valid YAML (kept as a plain string)."""


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts nesting depth and each node's expanded size (computed once,
    from its children's: one pass whatever the expansion) while composing, and refuses a mapping
    that repeats a key (keys brought in by a merge, ``<<: *base``, may be overridden)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader refuses it itself
                    continue
                if first is not key_node:
                    line, again = first.start_mark.line + 1, key_node.start_mark.line + 1
                    raise _DuplicateKey(problem=(
                        f"duplicate key {key!r} (first on line {line}, again on line {again}); "
                        "YAML would keep only the last value. Remove one of them"),
                        problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, tuple[yaml.Node, int]] = {}

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self._depth >= MAX_DEPTH:
            raise _LimitExceeded(problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=mark)
        is_alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        known = self._sizes.get(id(node))
        if is_alias:
            if known is None:
                raise _LimitExceeded(problem="an alias refers to a node that contains it "
                                     "(recursive alias)", problem_mark=mark)
            return node
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        size = 1 + sum(self._sizes[id(child)][1] for child in children)
        if size > MAX_NODES:
            raise _LimitExceeded(problem=f"expands to more than {MAX_NODES} YAML nodes once its "
                                 "aliases (*name) are expanded (an alias bomb?)", problem_mark=mark)
        self._sizes[id(node)] = (node, size)
        return node


def read_recipe_text(path: Path) -> str:
    """The text of a recipe file: at most :data:`MAX_RECIPE_BYTES`, UTF-8.

    Raises:
        RecipeError: unreadable, too large or not UTF-8; names the file.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RECIPE_BYTES + 1)
    except OSError as err:
        raise RecipeError(f"cannot read recipe file '{path}': {err.strerror}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe file '{path}' is larger than {MAX_RECIPE_BYTES} bytes; a recipe "
                          "is a small YAML file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"recipe file '{path}' is not UTF-8 text: byte "
                          f"0x{data[err.start]:02x} at offset {err.start}. Received: "
                          f"{data[max(0, err.start - 8):err.start + 8]!r}") from None


def parse_yaml(text: str, *, source: str) -> Any:
    """Parse one YAML document with the safe loader and the limits above.

    Raises:
        RecipeError: over the limits, a key repeated in a mapping (both lines named),
            malformed (with ``source:line:column``) or a value that cannot be built (e.g. an
            integer of thousands of digits); names ``source``.
        _NotYAML: (``--set`` values only) malformed YAML.
    """
    loader = None
    try:
        loader = _LimitedLoader(text)
        node = loader.get_single_node()
        return None if node is None else loader.construct_document(node)
    except _LimitExceeded as err:
        raise RecipeError(f"{_where(source, err.problem_mark)}: recipe refused: {err.problem}") from None
    except yaml.YAMLError as err:
        if source.startswith("--set"):
            raise _NotYAML(str(err)) from None
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or err
        raise RecipeError(f"{_where(source, mark)}: malformed YAML: {problem}") from None
    except (ValueError, OverflowError, RecursionError) as err:
        raise RecipeError(f"{source}: a value cannot be read: {err}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(source: str, mark) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``dotted.key=yaml_value`` applied.

    Raises:
        RecipeError: an override without ``=``, or one that descends into a non-mapping.
    """
    overrides = list(overrides)
    if not overrides:
        return raw
    result = copy.deepcopy(raw)
    for item in overrides:
        key, sep, value_text = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set expects KEY=VALUE (e.g. trainer.epochs=3). Received: '{item}'")
        try:
            value = parse_yaml(value_text, source=f"--set {key}") if value_text.strip() else ""
        except _NotYAML:
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
    return _switch_cluster_kind(result, raw, overrides)


def _switch_cluster_kind(result: dict[str, Any], raw: dict[str, Any], overrides: list[str]):
    """``--set cluster.kind=K`` on a recipe written for another kind (``kerasdist export``'s pods
    run ``--set cluster.kind=slurm`` on a ``local`` recipe): the file's cluster fields that K
    does not have are left out, with one log line; fields given by ``--set`` are kept (and
    refused by validation when K lacks them)."""
    from kerasdist.config.cluster_configs import cluster_config_classes, fields_of_other_kinds

    cluster = result.get("cluster")
    kind = cluster.get("kind") if isinstance(cluster, dict) else None
    written = raw.get("cluster") if isinstance(raw.get("cluster"), dict) else {}
    set_keys = {item.partition("=")[0].strip() for item in overrides}
    if "cluster.kind" not in set_keys or kind not in cluster_config_classes() or \
            written.get("kind", "this_process") == kind:
        return result
    dropped = [key for key in fields_of_other_kinds(kind, written)
               if f"cluster.{key}" not in set_keys]
    for key in dropped:
        del cluster[key]
    if dropped:
        from kerasdist import _log

        _log.get_logger("config").info(
            f"--set cluster.kind={kind}: the recipe's cluster.{', cluster.'.join(dropped)} "
            f"(of cluster.kind '{written.get('kind', 'this_process')}') do not apply and are left out")
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
        if item["type"] == "bool_for_number":  # raised for the section: name the field
            dotted += "." + item["ctx"]["field"]
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
    if kind in ("value_error", "bool_for_number"):  # they say what they received
        return msg.removeprefix("Value error, ")
    received = item.get("input")
    return f"{msg}. Received: {received!r}"


def _clean_loc(loc: tuple) -> tuple:
    # pydantic puts data.source's union tag in the path (data.source.csv.path), which is not a
    # key of the recipe: drop it (data.source.path).
    from kerasdist.config.source_configs import source_config_classes

    loc = tuple(loc)
    if loc[:2] == ("data", "source") and len(loc) > 2 and loc[2] in source_config_classes():
        return loc[:2] + loc[3:]
    return loc


def _key_marks(text: str) -> dict[tuple[str, ...], tuple[int, int]]:
    """Map each key path of the YAML text to the (line, column) of its key, 1-based."""
    try:
        loader = _LimitedLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError):
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


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe (every default filled in) as YAML text; ``data.source`` holds the
    chosen source kind's fields only."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the recipe, for editors (e.g. the YAML language server);
    ``strategy`` and ``cluster`` are each a ``oneOf`` of every registered kind's own schema.

    Returns:
        The schema as a JSON-ready dict.
    """
    from kerasdist.config.cluster_configs import cluster_config_classes
    from kerasdist.config.strategy_configs import strategy_config_classes

    schema = Recipe.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.setdefault("$defs", {})
    for section, classes in (("strategy", strategy_config_classes()),
                             ("cluster", cluster_config_classes())):
        default = schema["properties"][section].get("default")
        variants = []
        for kind, cls in classes.items():
            sub = cls.model_json_schema(ref_template="#/$defs/{model}")
            defs.update(sub.pop("$defs", {}))
            sub.setdefault("properties", {})["kind"] = {"const": kind, "title": "Kind",
                                                        "type": "string"}
            if kind != (default or {}).get("kind"):  # only the default kind may leave `kind` out
                sub["required"] = sorted({*sub.get("required", ()), "kind"})
            variants.append(sub)
        schema["properties"][section] = {
            "oneOf": variants, "default": default,
            "description": f"The {'tf.distribute strategy' if section == 'strategy' else 'cluster'}"
                           ", chosen by `kind`; the other fields depend on it."}
    source = defs["DataConfig"]["properties"]["source"]  # a kind's name alone is accepted too
    source["oneOf"] = [*source["oneOf"], {"enum": sorted(source["discriminator"]["mapping"]),
                                          "type": "string"}]
    del source["discriminator"]  # (a JSON Schema discriminator only picks between mappings)
    return schema
