"""Echo the log files of a local cluster's tasks to the console, each line prefixed with its task
(``[worker:1] Epoch 1/4 ...``), as ``kerasdist launch`` shows them; or one task's file without a
prefix (:meth:`Echo.follow`: the chief's progress under ``kerasdist fit``). TensorFlow's start-up
noise and kerasdist's verification records (:func:`kerasdist._log.is_record`) stay in the logs."""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from pathlib import Path

from kerasdist._log import is_record
from kerasdist._native_log import is_noise
from kerasdist.launch.processes import Task


class Echo:
    """Echo new lines of the tasks' log files to stdout, prefixed with the task name."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose  # keep TensorFlow's start-up noise and kerasdist's records
        self._offsets: dict[Path, int] = {}
        self._names: dict[Path, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kerasdist-echo", daemon=True)

    def add(self, task: Task) -> None:
        """Echo ``task``'s new log lines, prefixed ``[<task name>] ``."""
        self.follow(task.log_path, task.name)

    def follow(self, path: Path, name: str | None = None) -> None:
        """Echo the lines written to ``path`` from now on (what it holds already is skipped; a
        file that does not exist yet is read from its start once it does).

        Args:
            path: a log file.
            name: the prefix ``[<name>] `` of every line; None (default): no prefix (one task
                speaks).
        """
        self._names[path] = name
        self._offsets.setdefault(path, path.stat().st_size if path.exists() else 0)

    def __enter__(self) -> Echo:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.flush()

    def flush(self) -> None:
        for path, offset in list(self._offsets.items()):
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            complete = data.rfind(b"\n") + 1
            if complete:
                self._offsets[path] = offset + complete
                name = self._names[path]
                prefix = f"[{name}] " if name is not None else ""
                text = data[:complete].decode("utf-8", "replace")
                sys.stdout.write("".join(prefix + line + "\n" for line in text.splitlines()
                                         if self.verbose or not (is_noise(line) or is_record(line))))
                sys.stdout.flush()


class PrefixedStream:
    """A text stream that writes every line to ``stream`` with ``prefix`` in front (after each
    ``\n`` and ``\r``, so a progress bar redrawn in place keeps it); everything else (``isatty``,
    ``fileno``, ``encoding``) is ``stream``'s.

    Tasks that share one console (a pipe or a terminal) must not interleave within a line:
    ``print`` writes its arguments one by one. So text is held until a line (or a redraw) ends
    and then written whole, prefix included, in one write followed by a flush (one ``write(2)``
    of a line shorter than the pipe's atomic size); :meth:`flush` writes a held partial line
    (a progress bar that flushes mid-line shows at once)."""

    def __init__(self, stream, prefix: str):
        self._stream, self._prefix, self._at_start = stream, prefix, True
        self._held = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._held += text
            cut = max(self._held.rfind("\n"), self._held.rfind("\r"))
            if cut >= 0:
                whole, self._held = self._held[:cut + 1], self._held[cut + 1:]
                self._emit(whole)
        return len(text)

    def _emit(self, text: str) -> None:
        out = []
        for piece in re.split(r"([\r\n])", text):
            if piece in ("\r", "\n"):
                out.append(piece)
                self._at_start = True
            elif piece:
                if self._at_start:
                    out.append(self._prefix)
                    self._at_start = False
                out.append(piece)
        self._stream.write("".join(out))
        self._stream.flush()

    def flush(self) -> None:
        with self._lock:
            if self._held:
                held, self._held = self._held, ""
                self._emit(held)
            else:
                self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def prefixed_output(name: str):
    """While the block runs, ``sys.stdout`` and ``sys.stderr`` lines start with ``[<name>] `` (a
    task whose console other tasks write too, e.g. ``launch --this-task`` under Slurm).
    Output written to the file descriptors directly (TensorFlow's native log) is not."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (PrefixedStream(stream, f"[{name}] ") for stream in saved)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved


__all__ = ["Echo", "PrefixedStream", "prefixed_output"]
