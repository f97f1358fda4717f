"""Issue 42 item 2: Keras's ``fit`` verbosity per task (:func:`kerasdist._log.keras_verbose`):
the chief's bar on a terminal, one line an epoch in a file, silence for other tasks where the
console is shared; a task of kerasdist's local launcher (its own log file) keeps what it asks."""

from __future__ import annotations

import io

import pytest

from kerasdist import _log


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("verbose", [None, "auto"])
def test_auto_is_the_bar_on_a_terminal_and_one_line_an_epoch_elsewhere(monkeypatch, verbose):
    monkeypatch.delenv(_log.LAUNCHED_ENV, raising=False)
    monkeypatch.setattr("sys.stdout", _Terminal())
    assert _log.keras_verbose(verbose) == 1
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert _log.keras_verbose(verbose) == 2


@pytest.mark.parametrize("verbose", [None, "auto", 0, 1, 2])
def test_on_a_shared_console_only_the_chief_speaks(monkeypatch, verbose):
    monkeypatch.delenv(_log.LAUNCHED_ENV, raising=False)
    assert _log.shared_console()
    assert _log.keras_verbose(verbose, is_chief=False) == 0
    assert _log.keras_verbose(verbose, is_chief=True) == (2 if verbose in (None, "auto")
                                                          else verbose)


def test_a_task_with_a_log_of_its_own_keeps_its_verbosity(monkeypatch, tmp_path):
    monkeypatch.setenv(_log.LAUNCHED_ENV, str(tmp_path / "worker-1.status.json"))
    assert not _log.shared_console()
    assert _log.keras_verbose(2, is_chief=False) == 2
    assert _log.keras_verbose(0, is_chief=True) == 0


def test_a_prefixed_stream_names_the_task_on_every_line_and_every_redraw():
    from kerasdist.launch.echo import PrefixedStream, prefixed_output

    sink = _Terminal()
    stream = PrefixedStream(sink, "[worker:1] ")
    stream.write("Epoch 1/2\n1/4 ")
    stream.write("bar\r2/4 bar\nlast")
    stream.flush()  # a partial line is held until its end, or a flush
    assert sink.getvalue() == "[worker:1] Epoch 1/2\n[worker:1] 1/4 bar\r[worker:1] 2/4 bar\n[worker:1] last"
    assert stream.isatty()
    import sys

    before = sys.stdout
    with prefixed_output("worker:0"):
        assert isinstance(sys.stdout, PrefixedStream)
    assert sys.stdout is before


def test_a_prefixed_line_reaches_the_shared_console_whole_in_one_write():
    """Two tasks print to one pipe (``launch --this-task``): ``print`` writes its arguments one
    by one, so a stream that passed them on at once let another task's line land inside this
    one ('[worker:1] trained[worker:0] trained worker 0 2\\n worker 1 2', a README-suite run)."""
    from kerasdist.launch.echo import PrefixedStream

    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    sink = Recorder()
    print("trained worker", 1, 2, file=PrefixedStream(sink, "[worker:1] "))
    assert sink.writes == ["[worker:1] trained worker 1 2\n"]
