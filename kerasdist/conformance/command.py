"""``kerasdist conformance``: run the matrix and write ``docs/conformance.md``.

Exit codes: 0 when every cell passes or is refused with a reason; 1 when a cell fails or did not
run (each named on stderr); 2 for bad arguments (an unknown strategy or case, a local cluster
that cannot be isolated without ``--allow-network-exposure``), before anything starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from kerasdist.errors import EXIT_FAILED, EXIT_OK, ClusterError, RecipeError


def add_parser(sub) -> None:
    """Register the ``conformance`` subcommand on an argparse subparsers object."""
    from kerasdist.conformance.driver import STRATEGIES

    parser = sub.add_parser(
        "conformance", help="run Keras 3 features under every strategy against strategy-free runs "
                            "and write the matrix (docs/conformance.md)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma list of: {', '.join(STRATEGIES)} (default: all)")
    parser.add_argument("--cases", default=None,
                        help="comma list of case names (default: all; see docs/conformance.md)")
    parser.add_argument("--out", default="docs/conformance.md", type=Path,
                        help="Markdown file to write (its .json beside it); default "
                             "docs/conformance.md")
    parser.add_argument("--work-dir", default=None, type=Path,
                        help="keep results, logs and callback outputs here (default: a temporary "
                             "folder, removed at the end)")
    parser.add_argument("--timeout-s", type=float, default=1500.0,
                        help="limit for each strategy's processes, in seconds (default 1500)")
    parser.add_argument("--allow-network-exposure", action="store_true",
                        help="run the multi-process columns without a private network namespace")
    parser.add_argument("--sequential", action="store_true",
                        help="run the strategies one after another (default: all at once after "
                             "the strategy-free reference)")


def _parse(args) -> tuple[list[str], list[str]]:
    from kerasdist.conformance.cases import select
    from kerasdist.conformance.driver import STRATEGIES

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise RecipeError(f"--strategies: unknown or empty; choose from {', '.join(STRATEGIES)}. "
                          f"Received: --strategies={args.strategies!r}")
    cases = [c.strip() for c in (args.cases or "").split(",") if c.strip()]
    if args.cases is not None and not cases:
        raise RecipeError("--cases: empty; name one or more cases (comma list), or leave the flag "
                          f"out to run every case. Received: --cases={args.cases!r}")
    try:
        select(cases)
    except ValueError as err:
        raise RecipeError(f"--cases: {err}. Received: --cases={args.cases!r}") from None
    if not args.timeout_s > 0:
        raise RecipeError(f"--timeout-s must be > 0 seconds. Received: --timeout-s={args.timeout_s}")
    _check_writable(args.out, "--out")
    _check_writable(args.out.with_suffix(".json"), "--out (its .json beside it)")
    if args.work_dir is not None and args.work_dir.exists() and not args.work_dir.is_dir():
        raise RecipeError(f"--work-dir must be a directory; a file is in the way. Received: "
                          f"--work-dir={str(args.work_dir)!r}")
    return strategies, cases


def _check_writable(path: Path, flag: str) -> None:
    """Refuse, before anything runs, an output file that could not be written at the end: a
    directory in its place, a file where a parent folder must be, a folder this user cannot
    write (the matrix took minutes to hours; its results must not be lost to a bad path).

    Raises:
        RecipeError: naming ``flag`` and the path (exit code 2).
    """
    if path.is_dir():
        raise RecipeError(f"{flag} must be a file path; it is a directory. Received: "
                          f"{flag.split()[0]}={str(path)!r}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RecipeError(f"{flag}: {str(parent)!r} is a file, not a folder, so {str(path)!r} "
                          f"cannot be written. Received: {flag.split()[0]}={str(path)!r}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path,
                                                                                  os.W_OK)):
        raise RecipeError(f"{flag}: no permission to write {str(path)!r} (in {str(parent)!r}). "
                          f"Received: {flag.split()[0]}={str(path)!r}")


def _check_isolation(strategies, allow: bool) -> None:
    from kerasdist.launch import isolation
    from kerasdist.strategies import get

    clustered = [s for s in strategies if s != "reference" and get(s).traits.topology != "single"]
    reason = isolation.unavailable_reason() if clustered else None
    if reason and not allow:
        raise ClusterError(f"conformance: the {', '.join(clustered)} column(s) start local clusters "
                           f"whose task servers would be reachable from the network ({reason}); "
                           "pass --allow-network-exposure on a trusted machine. Received: "
                           "--allow-network-exposure not given")


def run(args: argparse.Namespace) -> int:
    """The ``kerasdist conformance`` command (module docs)."""
    from kerasdist._signals import terminate_on_sigterm

    strategies, cases = _parse(args)
    _check_isolation(strategies, args.allow_network_exposure)
    # SIGTERM unwinds like Ctrl-C: run_matrix stops the strategies' processes, the temporary
    # folder is removed (the processes also get SIGTERM if this one is killed: driver.start_strategy)
    with terminate_on_sigterm():
        folder = args.work_dir or Path(tempfile.mkdtemp(prefix="kerasdist-conformance-"))
        return _run(args, strategies, cases, folder)


def _run(args, strategies: list[str], cases: list[str], folder: Path) -> int:
    from kerasdist.conformance import report
    from kerasdist.conformance.driver import run_matrix

    try:
        matrix = run_matrix(strategies=strategies, case_names=cases, folder=folder.resolve(),
                            timeout_s=args.timeout_s,
                            allow_exposure=args.allow_network_exposure,
                            parallel=not args.sequential,
                            progress=lambda line: print(f"kerasdist conformance: {line}",
                                                        flush=True))
        command = (f"kerasdist conformance --strategies {','.join(strategies)}"
                   + (f" --cases {','.join(cases)}" if cases else ""))
        md, js = report.write(matrix, args.out, command=command)
    finally:
        if args.work_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"kerasdist conformance: wrote {md} and {js}")
    failures = matrix.failures()
    for case, strategy, detail in failures:
        print(f"kerasdist conformance: {case} under {strategy}: {detail}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_OK
