"""Write ``docs/architecture.md``'s supported-versions tables from the runs' own output (issue 32).

Inputs: the JSON files of ``tools/canary.py`` (one per TF/Keras pair: probes, mends, the core
matrix when it ran) and, per pair, the pytest logs of the fast subset and the core matrix (what
``.ci/other-versions`` runs). The table goes between the ``supported-versions`` markers of
``docs/architecture.md`` (``--out``); nothing in it is typed by hand.

    python tools/supported_versions.py --canary runs/canary-tf219.json ... \\
        --log 2.19.1:fast=runs/tf219.fast.log --log 2.19.1:matrix=runs/tf219.matrix.log \\
        --note "2.19.1:tensorflow-metadata<1.18 (protobuf 5)" --date 2026-11-26

The Python table (issue 51) comes from the logs of ``tools/quickstart_python.sh`` (the README's
clone quickstart on one Python each), between the ``python-versions`` markers:

    python tools/supported_versions.py --quickstart docs/version-runs/2026-11-29/py*.quickstart.log \\
        --date 2026-11-29
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- supported-versions:begin -->", "<!-- supported-versions:end -->"
PY_BEGIN, PY_END = "<!-- python-versions:begin -->", "<!-- python-versions:end -->"
_SUMMARY = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|error|errors|skipped|xfailed|xpassed|"
                      r"deselected|warnings?)(?:, )?)+) in ([\d.]+)s", re.M)


def pytest_summary(path: Path) -> str:
    """``"511 passed, 2 skipped in 354 s"`` from a pytest log's closing line, or what stopped it."""
    text = path.read_text(errors="replace")
    found = _SUMMARY.findall(text)
    if found:
        counts, seconds = found[-1]
        counts = ", ".join(c for c in counts.rstrip(", ").split(", ") if "deselected" not in c
                           and "warning" not in c)
        return f"{counts} in {float(seconds):.0f} s"
    verbose = re.findall(r"^(tests/\S+?(?:\[.*?\])?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL)", text, re.M)
    timed_out = re.findall(r"^(tests/\S+) \++ Timeout", text, re.M)
    if verbose or timed_out:  # a -v run that did not reach its end: what it reached
        counts = {o: sum(1 for _, x in verbose if x == o) for o in ("PASSED", "FAILED", "ERROR")}
        failed = [t for t, x in verbose if x in ("FAILED", "ERROR")]
        line = (f"unfinished: {counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} failed"
                + (f" ({', '.join(failed)})" if failed else ""))
        if timed_out:
            line += f"; then pytest-timeout ended the run in {timed_out[-1]}"
        return line
    if "+ Timeout +" in text:
        return "ended by pytest-timeout (a test over its limit)"
    return "no closing line"


def rows(canaries: list[dict], logs: dict, notes: dict, signatures: dict) -> list[str]:
    lines = ["| TensorFlow | Keras | install note | fast subset | core matrix | mends "
             "needed by their probes | probes flipped against the newest supported pair | patched symbols "
             "whose signature differs |",
             "|---|---|---|---|---|---|---|---|"]
    for c in sorted(canaries, key=lambda c: [int(p) if p.isdigit() else p for p in
                                             re.split(r"[.]", c["tensorflow"])]):
        tf, keras = c["tensorflow"], c["keras"]
        if c.get("install") == "failed":
            lines.append(f"| {tf} | {keras} | install failed | - | - | - | - | - |")
            continue
        needed = sum(1 for v in c["mends"].values() if v.split(": ")[-1] in ("needed", "active"))
        needed = f"{needed} of {len(c['mends'])}"
        flipped = ", ".join(f"{k} {a}->{b}" for k, (a, b) in c["flipped"].items()) or "none"
        pair = f"{tf}/{keras}"  # a TF minor run with two Keras versions: keys TF/KERAS

        def given(table, kind=None, default=None, pair=pair, tf=tf):
            keys = [(pair, kind), (tf, kind)] if kind else [pair, tf]
            return next((table[k] for k in keys if k in table), default)

        sig = given(signatures, default=c.get("signatures"))
        sig = "-" if sig is None else (f"none of {sig['symbols']}" if not sig["differ"] else
                                       ", ".join(sig["differ"]))
        matrix = given(logs, "matrix")
        if matrix is None and "cells" in c:
            changed = c.get("changed", {})
            matrix = (f"`kerasdist conformance`: {len(changed)} cells differ from expected.json"
                      + (": " + ", ".join(changed) if changed else ""))
        unknown = " (untested version)" if c.get("warning") else ""
        lines.append(f"| {tf}{unknown} | {keras} | {given(notes, default='-')} | "
                     f"{given(logs, 'fast', '-')} | {matrix or '-'} | {needed} | {flipped} | {sig} |")
    return lines


def quickstart_row(path: Path) -> tuple[tuple, str]:
    """A sort key and the table row of one ``tools/quickstart_python.sh`` log."""
    text = path.read_text(errors="replace")

    def find(pattern, default="-"):
        found = re.search(pattern, text, re.M)
        return found.groups() if found else default

    python, commit = find(r"^quickstart: Python (\S+) .* at (\S+) on", ("?", "?"))
    install_rc, install_s = find(r"^quickstart: install rc (\d+) in (\d+) s", ("?", "?"))
    if install_rc != "0":
        error = find(r"^(ERROR: .*)$", ("no ERROR line",))[0].replace("|", "\\|")
        install = f"failed (rc {install_rc}): `{error.strip()}`"
    else:
        install = f"`pip install -e \".[test]\"` {install_s} s"
    pair = " / ".join(find(r"^quickstart: tensorflow (\S+) keras (\S+)", ("-", "-")))
    fit_rc, fit_s = find(r"^quickstart: fit rc (\d+) in (\d+) s", ("-", "-"))
    accuracy = find(r"^held-out accuracy\s+(\S+)", ("-",))[0]
    wall = find(r"^wall time\s+([\d.]+ s)", ("-",))[0]
    fit = "-" if fit_rc == "-" else f"rc {fit_rc}: held-out accuracy {accuracy}, wall time {wall} " \
                                    f"({fit_s} s with the command's start-up)"
    key = tuple(int(p) if p.isdigit() else 0 for p in python.split("."))
    return key, f"| {python} | {commit} | {install} | {pair} | {fit} |"


def quickstart_table(logs: list[Path], date: str) -> str:
    """The Python table, markers included."""
    rows = [row for _, row in sorted(quickstart_row(p) for p in logs)]
    return "\n".join([
        PY_BEGIN,
        f"Generated by `tools/supported_versions.py --quickstart` from the logs of "
        f"`tools/quickstart_python.sh` of {date} (docs/version-runs/{date}): the README's clone "
        "quickstart, `kerasdist fit recipes/mnist_cnn.yaml` (5 epochs), in a fresh venv per Python, "
        "on the shared 2-core machine (`nice 10`).", "",
        "| Python | checkout | install | TensorFlow / Keras | quickstart fit |",
        "|---|---|---|---|---|", *rows, PY_END])


def _replace(text: str, begin: str, end: str, table: str, heading: str) -> str:
    if begin in text:
        return text[:text.index(begin)] + table + text[text.index(end) + len(end):]
    return text.rstrip("\n") + f"\n\n{heading}\n\n" + table + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--canary", nargs="+", type=Path, default=[],
                        help="tools/canary.py JSON files: the TensorFlow/Keras table")
    parser.add_argument("--quickstart", nargs="+", type=Path, default=[],
                        help="tools/quickstart_python.sh logs: the Python table")
    parser.add_argument("--log", action="append", default=[],
                        help="TF:fast=path or TF:matrix=path (a pytest log); TF/KERAS:... for one "
                        "pair of a TF version run with two Keras versions")
    parser.add_argument("--note", action="append", default=[], help="TF:text or TF/KERAS:text")
    parser.add_argument("--signatures", action="append", default=[],
                        help="TF=path: a JSON {symbols, differ} of the patched symbols' signatures "
                             "against tests/unit/compat_targets.json")
    parser.add_argument("--date", required=True, help="the day of the runs (YYYY-MM-DD)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.md")
    args = parser.parse_args(argv)
    if not args.canary and not args.quickstart:
        parser.error("give --canary (the TensorFlow/Keras table), --quickstart (the Python table) "
                     "or both")
    text = args.out.read_text()
    if args.quickstart:
        table = quickstart_table(args.quickstart, args.date)
        text = _replace(text, PY_BEGIN, PY_END, table, "### Python versions")
        print(table)
    if args.canary:
        table = tf_table(args)
        text = _replace(text, BEGIN, END, table, "## Supported versions")
        print(table)
    args.out.write_text(text)
    return 0


def tf_table(args) -> str:
    """The TensorFlow/Keras table, markers included."""
    logs = {}
    for item in args.log:
        tf, rest = item.split(":", 1)
        kind, path = rest.split("=", 1)
        logs[(tf, kind)] = pytest_summary(Path(path))
    notes = dict(item.split(":", 1) for item in args.note)
    canaries = [json.loads(p.read_text()) for p in args.canary]
    signatures = {tf: json.loads(Path(path).read_text().strip().splitlines()[-1])
                  for tf, path in (item.split("=", 1) for item in args.signatures)}
    base = canaries[0].get("baseline_versions", {})
    return "\n".join([
        BEGIN,
        f"Generated by `tools/supported_versions.py` from the runs of {args.date} (a shared "
        "2-core machine: the times are that day's, not a quiet machine's). Probes are compared "
        f"with tensorflow {base.get('tensorflow')} / keras {base.get('keras')}, the newest "
        "supported pair (`.ci/run` runs the full suite on it).", "",
        *rows(canaries, logs, notes, signatures), END])


if __name__ == "__main__":
    sys.exit(main())
