"""``kerasdist conformance``: run the matrix and write ``docs/conformance.md``.

Exit codes: 0 when every cell passes or is refused with a reason; 1 when a cell fails or did not
run (each named on stderr); 2 for bad arguments (an unknown strategy or case, a local cluster
that cannot be isolated without ``--allow-network-exposure``), before anything starts.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--cases", default="",
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
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    try:
        select(cases)
    except ValueError as err:
        raise RecipeError(f"--cases: {err}. Received: --cases={args.cases!r}") from None
    return strategies, cases


def _check_isolation(strategies, allow: bool) -> None:
    from kerasdist.launch import isolation

    clustered = [s for s in strategies if s in ("multi_worker", "parameter_server")]
    reason = isolation.unavailable_reason() if clustered else None
    if reason and not allow:
        raise ClusterError(f"conformance: the {', '.join(clustered)} column(s) start local clusters "
                           f"whose task servers would be reachable from the network ({reason}); "
                           "pass --allow-network-exposure on a trusted machine. Received: "
                           "--allow-network-exposure not given")


def run(args: argparse.Namespace) -> int:
    """The ``kerasdist conformance`` command (module docs)."""
    from kerasdist.conformance import report
    from kerasdist.conformance.driver import run_matrix

    strategies, cases = _parse(args)
    _check_isolation(strategies, args.allow_network_exposure)
    folder = args.work_dir or Path(tempfile.mkdtemp(prefix="kerasdist-conformance-"))
    try:
        matrix = run_matrix(strategies=strategies, case_names=cases, folder=folder.resolve(),
                            timeout_s=args.timeout_s,
                            allow_exposure=args.allow_network_exposure,
                            parallel=not args.sequential,
                            progress=lambda line: print(f"kerasdist conformance: {line}",
                                                        flush=True))
        command = "kerasdist conformance" + (
            f" --strategies {','.join(strategies)}" if args.strategies else "") + (
            f" --cases {','.join(cases)}" if cases else "")
        md, js = report.write(matrix, args.out, command=command)
    finally:
        if args.work_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"kerasdist conformance: wrote {md} and {js}")
    failures = matrix.failures()
    for case, strategy, detail in failures:
        print(f"kerasdist conformance: {case} under {strategy}: {detail}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_OK
