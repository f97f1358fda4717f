"""The ``kerasdist`` command line: ``fit``, ``validate``, ``evaluate``, ``env``, ``schema``, ``bench``,
``export``.

Exit codes (defined in :mod:`kerasdist.errors`): 0 success; 2 bad input (recipe, data, run
directory; nothing written, nothing started); 1 a failure during training (a lost task, or a
deterministic error such as a label out of range, shown with its original message); 130
interrupted or preempted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from typing import Sequence

from kerasdist import _log, cli_export, cli_ops
from kerasdist.errors import (
    BAD_INPUT,
    EXIT_BAD_INPUT,
    EXIT_OK,
    KerasdistError,
    exit_code,
)


def _add_recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="path to a YAML recipe (see recipes/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set trainer.epochs=3 (repeatable; "
                             "VALUE is parsed as YAML; the result is validated again)")


def _add_role_args(parser: argparse.ArgumentParser) -> None:
    roles = parser.add_argument_group(
        "cluster role (seed-style flags; alternative to the TF_CONFIG environment variable)")
    roles.add_argument("--job-name", choices=["chief", "worker", "ps"])
    roles.add_argument("--task-index", type=int, default=None, help="this task's index (default 0)")
    roles.add_argument("--ps-hosts", default=None, help="comma-separated host:port list")
    roles.add_argument("--worker-hosts", default=None, help="comma-separated host:port list")
    roles.add_argument("--chief-host", default=None, help="host:port of the chief (coordinator)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerasdist", description="Distributed training of Keras 3 models from YAML recipes.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from kerasdist import cli_init

    cli_init.add_parser(sub)  # first in --help: where a new user starts

    fit = sub.add_parser("fit", help="train, evaluate and save the model a recipe describes")
    _add_recipe_args(fit)
    fit.add_argument("--overwrite", action="store_true",
                     help="start afresh: move a previous run in output.run_dir aside to "
                          "<run_dir>.old-<time> (nothing is deleted)")
    fit.add_argument("--verbose", type=int, choices=[0, 1, 2], default=None,
                     help="Keras progress output: 0 silent, 1 progress bar, 2 one line per epoch")
    fit.add_argument("--debug", action="store_true",
                     help="on a failure, also print the Python traceback (also: KERASDIST_DEBUG=1)")
    fit.add_argument("--quiet", action="store_true",
                     help="local clusters: do not show the chief task's progress on the console "
                          "(it stays in <run_dir>/logs)")
    _add_role_args(fit)

    validate = sub.add_parser("validate", help="check a recipe and print it resolved (no training)")
    _add_recipe_args(validate)
    validate.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    validate.add_argument("--import", dest="import_builder", action="store_true",
                          help="import the module of an import-path model.name (this runs its "
                               "code) and check model.params against the builder, and build the "
                               "optimizer, schedule, loss, metrics and callbacks with Keras "
                               "(imports every import path they name); without it their shape "
                               "and the paths' syntax only are checked")
    validate.add_argument("--check-data", action="store_true",
                          help="also build the model (implies --import; needs TensorFlow) and "
                               "check the data splits against it (labels, shapes, NaN/inf), the "
                               "metrics, the loss, output.run_dir and that the output.tracking "
                               "store answers, as fit would")

    sub.add_parser("schema", help="print the recipe JSON Schema (for editor completion)")

    cli_ops.add_parsers(sub, _add_role_args)
    from kerasdist.conformance import command as conformance

    conformance.add_parser(sub)

    bench = sub.add_parser("bench", help="run a recipe under several strategies and baselines")
    _add_recipe_args(bench)
    bench.add_argument("--strategies", default="default,mirrored,multi_worker,parameter_server",
                       help="comma list of: default, mirrored, multi_worker, parameter_server, "
                            "multi_worker_bf16 (16-bit all-reduce), default_stream (default "
                            "with the recipe's images streamed from TFRecord files), legacy, "
                            "ray (multi_worker on "
                            "a local Ray; needs .[ray]) (default: default, mirrored, "
                            "multi_worker, parameter_server)")
    bench.add_argument("--baselines", default="plain_keras,raw_step,tf_keras,keras_enable",
                       help="comma list of: plain_keras, raw_step, tf_keras (needs .[bench]), "
                            "keras_enable (each strategy with only kerasdist.enable() and the "
                            "user's own model.fit: the strategy row's ratio to it is kerasdist's "
                            "lifecycle cost)")
    bench.add_argument("--repeats", type=int, default=1, help="runs per row (median and spread)")
    bench.add_argument("--workers", type=int, default=2, help="workers of cluster strategies")
    bench.add_argument("--sweep-workers", default="",
                       help="comma list of worker counts to sweep for multi_worker and "
                            "parameter_server, e.g. 1,2,3")
    bench.add_argument("--target-accuracy", type=float, default=0.98,
                       help="held-out accuracy for the time-to-accuracy column")
    bench.add_argument("--out", default="runs/bench", help="folder for bench.json, table, plots")
    bench.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    bench.add_argument("--coordinator-scaling", default="",
                       help="comma list of worker counts, e.g. 1,2,4,8: also measure the steps/s "
                            "a parameter-server coordinator sustains (kerasdist vs tf_keras)")
    cli_export.add_parser(sub, _add_recipe_args)
    return parser


def _load_without_imports(args, imports: bool = False):
    """The recipe, with an import-path ``model.name`` checked for syntax only unless ``imports``."""
    import contextlib

    from kerasdist.config import load_recipe
    from kerasdist.models import registry

    with contextlib.nullcontext() if imports else registry.no_imports():
        return load_recipe(args.recipe, args.overrides)


def _cmd_validate(args) -> int:
    from kerasdist.config import dump_recipe
    from kerasdist.models import registry

    imports = args.import_builder or args.check_data
    recipe = _load_without_imports(args, imports)
    note = None
    if registry.is_import_path(recipe.model.name) and not imports:
        note = (f"model.name '{recipe.model.name}': import path checked for syntax only, not "
                "imported (its module and model.params are unchecked; --import imports it, "
                "which runs its code)")
    from kerasdist.config.training_configs import keras_checked_fields

    unchecked = [] if imports else keras_checked_fields(recipe)
    if unchecked:
        shape = (f"{', '.join(unchecked)}: checked for shape only (--import builds them with "
                 "Keras, importing their import paths)")
        note = f"{note}; {shape}" if note else shape
    from kerasdist.launch.run import check_shape

    check_shape(recipe)  # what fit refuses before anything starts: batch vs replicas, task count
    if args.check_data:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from kerasdist.training.checks import check_recipe_here

        check_recipe_here(recipe)
        from kerasdist import tracking

        tracking.check(recipe)  # the tracking store answers (a warning if not required)
    elif imports:  # build the optimizer, schedule, loss, metrics and callbacks with Keras
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from kerasdist.training.keras_objects import check_training_config

        check_training_config(recipe)
    from kerasdist.launch import clusters

    role = clusters.of(recipe).role_note(recipe)  # tf_config: this machine's TF_CONFIG checked
    if role:
        note = f"{note}; {role}" if note else role
    if args.json:
        print(json.dumps(recipe.model_dump(mode="json"), indent=2))
        if note:
            print(f"kerasdist: {note}", file=sys.stderr)
    else:
        checked = "; model, data and run dir checked" if args.check_data else ""
        print(f"# {args.recipe}: valid recipe (defaults filled in{checked})")
        if note:
            print(f"# {note}")
        print(dump_recipe(recipe), end="")
    return EXIT_OK


def _cmd_schema(args) -> int:
    from kerasdist.config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


ROLE_FLAGS = (("--job-name", "job_name"), ("--task-index", "task_index"),
              ("--ps-hosts", "ps_hosts"), ("--worker-hosts", "worker_hosts"),
              ("--chief-host", "chief_host"))


def _role_flags(args) -> list[str]:
    """The seed-style role flags given on the command line, as ``--flag=value``."""
    return [f"{flag}={getattr(args, dest)}" for flag, dest in ROLE_FLAGS
            if getattr(args, dest) is not None]


def _fit_recipe(args):
    """The recipe of ``fit`` and this task's role from the seed-style flags (None without them).

    Raises:
        ClusterError: role flags without ``--job-name``, or on a recipe whose strategy runs in
            this process only (topology ``single``), where they would be ignored.
    """
    from kerasdist.config import load_recipe
    from kerasdist.errors import ClusterError

    recipe = load_recipe(args.recipe, args.overrides)
    given = _role_flags(args)
    if not given:
        return recipe, None
    traits = recipe.strategy.traits
    if traits.topology == "single":
        raise ClusterError(f"{', '.join(g.split('=')[0] for g in given)}: cluster role flags, but "
                           f"strategy '{recipe.strategy.kind}' runs in this one process (it has no "
                           f"cluster roles); remove them or use a cluster strategy. Received: "
                           f"{' '.join(given)}")
    if args.job_name is None:
        raise ClusterError(f"{given[0].split('=')[0]} needs --job-name (chief, worker or ps). "
                           f"Received: {' '.join(given)}")
    tf_config = cli_ops.flags_role(args)
    if traits.needs_ps and not tf_config.num("ps"):
        raise ClusterError(f"strategy '{recipe.strategy.kind}' needs --ps-hosts. "
                           f"Received: ps_hosts='{args.ps_hosts or ''}'")
    recipe = load_recipe(args.recipe, [*args.overrides, "cluster.kind=tf_config"])
    return recipe, tf_config


def _cmd_fit(args) -> int:
    import time

    from kerasdist._signals import startup

    started = time.perf_counter()  # the summary's wall time counts from here

    with startup("reading the recipe and importing TensorFlow"):  # SIGINT/SIGTERM: 130/143
        recipe, tf_config = _fit_recipe(args)
        restarted = recipe.cluster.traits.starts_tasks
        from kerasdist.launch import explain

        explain.RUN.update(run_dir=recipe.output.run_dir,
                           max_restarts=recipe.cluster.max_restarts if restarted else None)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from kerasdist.launch import run_recipe
        from kerasdist.training import summary_text

    result = run_recipe(recipe, overwrite=args.overwrite, verbose=args.verbose, tf_config=tf_config,
                        echo=not args.quiet)
    from kerasdist.launch.status import STATUS_ENV

    # a local cluster's chief: its launcher prints the summary (and shows this task's log)
    if result is not None and os.environ.get(STATUS_ENV) is None:
        print(summary_text(result, tensorboard=recipe.output.tensorboard,
                           command_s=time.perf_counter() - started))
    return EXIT_OK


def _run_of(module: str):
    """A command whose ``run(args)`` is in ``module``, imported when the command runs."""
    return lambda args: importlib.import_module(module).run(args)


COMMANDS = {"fit": _cmd_fit, "validate": _cmd_validate, "schema": _cmd_schema,
            "bench": _run_of("kerasdist.bench.command"),
            "export": lambda args: cli_export.run(args, cli_export.load_as_tasks_will(args)),
            "conformance": _run_of("kerasdist.conformance.command"),
            "init": _run_of("kerasdist.cli_init"), "sweep": _run_of("kerasdist.sweep.command"),
            **cli_ops.COMMANDS}


def console(argv: Sequence[str] | None = None) -> int:
    """The console-script and ``python -m kerasdist`` entry: :func:`main` with TensorFlow's
    native noise filtered from stderr until the process ends (:mod:`kerasdist._native_log`)
    unless ``--verbose 2``; with the filter on, the process then ends with the returned code
    without running TensorFlow's destructors (:func:`kerasdist._native_log.end_with`)."""
    from kerasdist import _native_log

    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--verbose"), None)
    verbose = next((a.split("=", 1)[1] for a in argv if a.startswith("--verbose=")), verbose)
    _native_log.filter_native_stderr(2 if verbose == "2" else None)
    _native_log.enable_crash_traces()
    code = main(argv)
    _native_log.end_with(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (see module docs)."""
    from kerasdist._timeline import mark

    mark("main")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from kerasdist._version import __version__

        print(f"kerasdist {__version__}")
        return EXIT_OK
    if not args.command:
        parser.print_help()
        return EXIT_BAD_INPUT
    if args.command == "fit" and not _log.shared_console():  # a task of the local launcher:
        from kerasdist._preload import tensorflow_in_background  # it trains, so TF's import

        tensorflow_in_background()  # overlaps its recipe's validation
    _log.configure(getattr(args, "verbose", None))
    _log.one_line_deprecations()
    from kerasdist import _exit
    from kerasdist._compat import versions

    versions.warn_if_untested(_log.get_logger("compat"))  # one line; metadata only, no TF import

    debug = bool(getattr(args, "debug", False)) or os.environ.get("KERASDIST_DEBUG") == "1"
    failed = functools.partial(_failed, command=args.command, debug=debug)
    from kerasdist.importpath import user_code_on_path

    try:  # import paths resolve like `python -m`: the working directory, the recipe's folder
        with _exit.reporting_to(failed), user_code_on_path(getattr(args, "recipe", None)):
            return COMMANDS[args.command](args)
    except (Exception, KeyboardInterrupt) as err:
        return failed(err)


def _failed(err: BaseException, command: str | None = None, debug: bool = False) -> int:
    """Report a failure (stderr, and the task's status file under a kerasdist launcher) and
    return its exit code. Bad input shows only the message; an interrupted ``fit`` says its
    checkpoint is kept, another command only that it stopped. A failure during training shows
    the error's own message (cut to six lines) and, for ``fit`` and ``launch``, ends with the
    closing paragraph of :mod:`kerasdist.launch.explain` (task, step, whether a re-run helps, the
    logs); the Python traceback only with ``debug`` (``--debug``, ``KERASDIST_DEBUG=1``)."""
    from kerasdist.launch import status

    failure = status.report(err)
    if isinstance(err, KeyboardInterrupt):
        kept = "; the latest checkpoint is kept, re-run to resume" if command == "fit" else ""
        print(f"kerasdist: interrupted{kept}. {err}", file=sys.stderr)
        return exit_code(failure, err)
    if failure == BAD_INPUT:
        print(f"kerasdist: error: {err}", file=sys.stderr)
        return exit_code(failure, err)
    if debug:
        import traceback

        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
    from kerasdist.launch.explain import RUN, brief, paragraph

    if isinstance(err, KerasdistError):  # TaskFailedError, TrainingError: their message
        print(f"kerasdist: failed: {err}", file=sys.stderr)
    else:
        print(f"kerasdist: failed: {type(err).__name__}: {brief(err)}", file=sys.stderr)
    if command in ("fit", "launch") and RUN and os.environ.get(status.STATUS_ENV) is None:
        print(paragraph(err, run_dir=RUN.get("run_dir"), logs=RUN.get("logs"),
                        max_restarts=RUN.get("max_restarts")), file=sys.stderr)
    return exit_code(failure, err)
