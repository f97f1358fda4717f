"""Cluster kinds are kinds (:mod:`kerasdist.launch.clusters`): one config class, one module, one
registry line add a scheduler, and no code outside the kinds folder and
:mod:`kerasdist.config.cluster_configs` compares a ``cluster.kind`` string (an AST scan of the
package, as ``test_import_graph.py`` reads it)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import ClassVar, Literal

import pytest

import kerasdist
from kerasdist.config import cluster_configs
from kerasdist.config.cluster_configs import ClusterConfigBase, ClusterTraits, register_cluster_config
from kerasdist.config.strategy_configs import strategy_config_classes
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.launch import clusters
from kerasdist.launch.clusters.base import ClusterKind

ROOT = Path(kerasdist.__file__).parent
ALLOWED = ("launch/clusters/", "config/cluster_configs.py")
"""Where a cluster kind's name may be compared: the kinds folder and the config classes."""


# ------------------------------------------------------------------------------- a toy kind
class ToyClusterConfig(ClusterConfigBase):
    """The config half: its kind, its traits (it runs one-process strategies), its fields."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(topologies=("single",))
    kind: Literal["toy"] = "toy"
    workers: ClassVar[int] = 1
    ps: ClassVar[int] = 0
    max_restarts: ClassVar[int] = 0
    min_workers: ClassVar[None] = None
    greeting: str = "hello"


class ToyKind(ClusterKind):
    """The module half: runs the lifecycle here, as ``this_process`` does, and says so."""

    ran: ClassVar[list] = []

    def run(self, recipe, *, overwrite, verbose, callbacks, echo, tf_config):
        self.ran.append(recipe.cluster.greeting)
        return clusters.get("this_process").run(recipe, overwrite=overwrite, verbose=verbose,
                                                callbacks=callbacks, echo=echo,
                                                tf_config=tf_config)


@pytest.fixture
def toy_kind(monkeypatch):
    """The toy kind registered (config class and kind object), unregistered afterwards; no
    strategy is touched (they read the cluster kinds' traits)."""
    monkeypatch.setattr(cluster_configs.CLUSTERS, "_classes", cluster_configs.CLUSTERS.classes())
    monkeypatch.setattr(clusters._KINDS, "_objects", dict(clusters._KINDS._objects))
    strategies = {kind: cls.traits for kind, cls in strategy_config_classes().items()}
    register_cluster_config(ToyClusterConfig)  # the config class
    clusters.register("toy", ToyKind)  # the registry line
    ToyKind.ran.clear()
    yield
    assert {kind: cls.traits for kind, cls in strategy_config_classes().items()} == strategies


def test_a_toy_kind_added_as_documented_runs_a_recipe_through_run_recipe(toy_kind, tmp_path):
    from kerasdist.config import validate_recipe
    from kerasdist.launch import run_recipe

    recipe = validate_recipe({
        "model": {"name": "linear"},
        "data": {"source": {"kind": "synthetic_linear", "num_examples": 128},
                 "train_split": "train", "eval_split": "test", "batch_size": 32},
        "optimizer": {"name": "sgd", "learning_rate": 0.1},
        "strategy": {"kind": "default"},
        "cluster": {"kind": "toy", "greeting": "hi"},
        "trainer": {"epochs": 1, "verbose": 0},
        "output": {"run_dir": str(tmp_path / "run")},
    })
    assert "toy" in clusters.available()
    result = run_recipe(recipe)
    assert ToyKind.ran == ["hi"]  # the toy's own run, found by kind
    assert result.extra["global_steps"] == 128 // 32
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_a_toy_kind_runs_the_strategies_its_traits_name_and_no_other(toy_kind):
    from kerasdist.config import validate_recipe

    assert validate_recipe({"strategy": {"kind": "mirrored"}, "cluster": {"kind": "toy"}})
    with pytest.raises(RecipeError, match=r"strategy 'multi_worker' needs cluster.kind 'local' or "
                                          r"'tf_config' or 'slurm' or 'jobset' or 'ray'\. "
                                          r"Received: kind='toy'"):
        validate_recipe({"strategy": {"kind": "multi_worker"}, "cluster": {"kind": "toy"}})
    with pytest.raises(RecipeError, match=r"strategy 'default' needs cluster.kind 'this_process' "
                                          r"or 'toy'\. Received: kind='local'"):
        validate_recipe({"strategy": {"kind": "default"}, "cluster": {"kind": "local"}})


def test_an_unknown_kind_lists_the_known_ones():
    with pytest.raises(ClusterError, match=r"unknown cluster kind 'nope'; available: jobset, "
                                           r"local, ray, slurm, tf_config, this_process"):
        clusters.get("nope")
    with pytest.raises(ClusterError, match="takes a kerasdist.launch.clusters.base.ClusterKind"):
        clusters.register("nope", object())


def test_every_builtin_kind_has_a_config_class_and_a_kind_that_fits_its_traits():
    """The kind objects agree with the traits their config classes declare: kinds that start
    their tasks are launchers of a local cluster (preflight, isolation, the run dir's lock), kinds
    whose roles come from the environment are tasks of someone else's cluster."""
    from kerasdist.launch.clusters.local import LocalKind
    from kerasdist.launch.clusters.tf_config import ScheduledKind

    configs = cluster_configs.cluster_config_classes()
    assert set(clusters.available()) == set(configs)
    for kind, config in configs.items():
        obj = clusters.get(kind)
        assert obj.kind == kind
        assert isinstance(obj, LocalKind) == config.traits.starts_tasks, kind
        assert isinstance(obj, ScheduledKind) == config.traits.roles_from_environment, kind


# ----------------------------------------------------------- no kind strings outside the kinds
def _kind_names() -> set[str]:
    return set(cluster_configs.cluster_config_classes())


def _names_a_kind(node, kinds) -> bool:
    """A string constant that is a kind's name, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in kinds
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e, kinds) for e in node.elts)
    return False


def _is_kind(node) -> bool:
    """``<anything>.cluster.kind``, ``cluster.kind``, or a name or attribute called ``kind``."""
    text = ast.unparse(node)
    return text.endswith("cluster.kind") or text == "kind" or text.endswith(".kind")


def kind_compares(source: str, kinds) -> list[int]:
    """Lines of ``source`` that compare a cluster kind with ``==``, ``!=``, ``in``, ``not in``
    (or ``is``), or ``match`` on it: any compare of ``cluster.kind``, and any compare of a
    ``kind`` with a cluster kind's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(ast.unparse(o).endswith("cluster.kind") for o in operands) or (
                    any(_is_kind(o) for o in operands)
                    and any(_names_a_kind(o, kinds) for o in operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match):
            values = [p.value for c in node.cases for p in ast.walk(c.pattern)
                      if isinstance(p, ast.MatchValue)]
            if ast.unparse(node.subject).endswith("cluster.kind") or (
                    _is_kind(node.subject) and any(_names_a_kind(v, kinds) for v in values)):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_every_form_of_kind_compare():
    source = textwrap.dedent("""
        a = recipe.cluster.kind == "local"
        b = cluster.kind != x
        c = recipe.cluster.kind in ("local", "ray")
        kind = recipe.cluster.kind
        d = kind not in ["slurm"]
        e = "jobset" == config.kind
        match recipe.cluster.kind:
            case "ray":
                pass
        match kind:
            case "slurm" | "tf_config":
                pass
        f = recipe.strategy.kind == "default"
        g = {"local": 1}[recipe.cluster.kind]
        h = recipe.cluster.traits.starts_tasks
    """)
    assert kind_compares(source, _kind_names()) == [2, 3, 4, 6, 7, 8, 11]


def test_no_cluster_kind_string_is_compared_outside_the_kinds():
    kinds = _kind_names()
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for line in kind_compares(path.read_text(encoding="utf-8"), kinds):
            bad.append(f"kerasdist/{relative}:{line}")
    assert not bad, "cluster.kind compared outside launch/clusters/ and config/cluster_configs.py " \
                    "(read the kind's traits, or ask its kind object): " + ", ".join(bad)
