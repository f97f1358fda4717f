"""Source ``csv``: CSV files with a header row, columns matched by name
(:class:`~kerasdist.data.csv_source.CsvSource`)."""

from __future__ import annotations

from kerasdist.data.csv_source import CsvSource
from kerasdist.data.sources.base import FileKind


class CsvKind(FileKind):
    kind = "csv"
    source_class = CsvSource
