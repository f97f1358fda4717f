"""One task of ``kerasdist launch``: run a user's script with kerasdist enabled, or serve.

``python -m kerasdist.launch.script_task SCRIPT [ARGS...]`` applies :func:`kerasdist.enable`, then
runs the script as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``, its role from ``TF_CONFIG``;
an exception from the script is recorded in the task's status file (:mod:`kerasdist.launch.status`).
``--serve`` runs a ``ps`` or ``worker`` server of a parameter-server cluster until stopped.
"""

from __future__ import annotations

import os
import runpy
import sys


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` as ``__main__`` with ``args``; returns its exit code (0 when it returns)."""
    from kerasdist.keras import enable  # kerasdist.enable(), without importing the package's top
    from kerasdist.launch import status

    enable()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        code = code if isinstance(code, int) else (0 if code is None else 1)
        if code:
            from kerasdist.errors import TrainingError

            status.report(TrainingError(f"the script exited with code {code}"))
        return code
    except (Exception, KeyboardInterrupt) as err:
        status.report(err)
        raise
    return 0


def serve() -> int:
    """Serve this ``ps``/``worker`` task (role from ``TF_CONFIG``) until stopped."""
    from kerasdist.cluster.server import serve as serve_task
    from kerasdist.cluster.spec import parse_tf_config

    serve_task(parse_tf_config(os.environ.get("TF_CONFIG"), require_ps=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return serve()
    if not argv:
        print("usage: python -m kerasdist.launch.script_task SCRIPT [ARGS...] | --serve",
              file=sys.stderr)
        return 2
    return run_script(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
