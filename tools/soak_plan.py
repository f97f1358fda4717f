"""The plan of ``tools/soak.py``: which runs, in which order, with which recipe, on which data.

Pure Python (no TensorFlow, no process started): the soak's data set is written with the standard
library only (CSV files, 8x8 grayscale PNG files), and each recipe is written as JSON, which is
YAML too.

Each run is as small as a run can be while still really distributed: 2 epochs of 4 steps, a
one-unit linear model on ``synthetic_linear`` data, a two-layer MLP of 8 units on a 4-column CSV
table, a small CNN on 8x8 images; ``multi_worker`` is 2 local worker processes,
``parameter_server`` 1 ps + 2 workers + the coordinator, ``mirrored`` 2 logical CPU devices.
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct
import zlib
from pathlib import Path
from typing import Mapping, Sequence

from soak_report import Expectation

STRATEGIES = ("default", "mirrored", "multi_worker", "parameter_server")
SOURCES = ("memory", "csv", "image_folder")
FAILURE_KINDS = ("bad_label", "sigint")
FULL_RUNS = {"default": 50, "mirrored": 50, "multi_worker": 100, "parameter_server": 100}

EPOCHS, STEPS, BATCH = 2, 4, 16
SIGINT_EPOCHS = 2000  # a SIGINT run trains until the signal; the timeout bounds it
BAD_LABEL = 7  # for a 2-class model
BAD_LABEL_NEEDLE = "labels must be in [0, 2)"

STRATEGY_SECTIONS = {
    "default": ({"kind": "default"}, {"kind": "this_process"}),
    "mirrored": ({"kind": "mirrored", "logical_cpus": 2}, {"kind": "this_process"}),
    "multi_worker": ({"kind": "multi_worker"}, {"kind": "local", "workers": 2}),
    "parameter_server": ({"kind": "parameter_server"}, {"kind": "local", "workers": 2, "ps": 1}),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One planned run.

    Attributes:
        index: position in the soak, from 1.
        strategy: one of :data:`STRATEGIES`.
        source: one of :data:`SOURCES` (``memory``: ``synthetic_linear``).
        mlflow: track the run with MLflow into SQLite in its run directory.
        hog: run it beside the CPU hog.
        kind: ``normal``, or a deliberately failing kind of :data:`FAILURE_KINDS`.
        seed: ``trainer.seed`` and ``data.shuffle_seed`` of the run.
    """

    index: int
    strategy: str
    source: str
    mlflow: bool
    hog: bool
    kind: str = "normal"
    seed: int = 0

    @property
    def name(self) -> str:
        """``0007-multi_worker-csv`` (+ ``-bad_label``): the run's folder and log name."""
        extra = "" if self.kind == "normal" else f"-{self.kind}"
        return f"{self.index:04d}-{self.strategy}-{self.source}{extra}"

    def expectation(self) -> Expectation:
        """Exit 0 with ``metrics.json`` and ``model.keras`` written; a bad label: exit 2 with
        the label message and no traceback; SIGINT mid-training: exit 130."""
        if self.kind == "bad_label":
            return Expectation(2, needle=BAD_LABEL_NEEDLE, forbid=("Traceback",))
        if self.kind == "sigint":
            return Expectation(130)
        return Expectation(0, files=("metrics.json", "model.keras"))


def _flags(count: int, fraction: float, rng: random.Random) -> list[bool]:
    """``count`` flags of which ``round(count * fraction)`` are true, in a seeded random order."""
    on = round(count * fraction)
    flags = [True] * on + [False] * (count - on)
    rng.shuffle(flags)
    return flags


def plan(counts: Mapping[str, int], *, sources: Sequence[str] = SOURCES, mlflow_fraction: float = 0.5,
         hog_fraction: float = 0.0, failures: int = 0, failure_kinds: Sequence[str] = FAILURE_KINDS,
         seed: int = 0) -> list[RunSpec]:
    """The soak's runs, interleaved over the strategies.

    Each strategy gets ``counts[strategy]`` ordinary runs cycling through ``sources`` (each
    strategy starting one source further on, so 1 run per strategy still covers them), plus
    ``failures`` deliberately failing runs cycling through ``failure_kinds``, each strategy one
    kind further on (so 1 failure per strategy still covers every kind; a ``bad_label`` run reads
    the csv source). Within a strategy exactly ``round(n * fraction)`` of its ``n`` runs
    are tracked with MLflow and as many run beside the hog, chosen at random with ``seed``. The
    strategies are interleaved by progress (run k of a strategy of n runs sits at k / n), so a
    slow spell of the machine falls on every strategy alike.

    Args:
        counts: ordinary runs per strategy, ``{strategy: n}``; a strategy not in it is left out
            (one with 0 still gets its ``failures``).
        sources: the data sources to cycle through.
        mlflow_fraction: share of the runs tracked with MLflow, in [0, 1].
        hog_fraction: share of the runs beside the CPU hog, in [0, 1].
        failures: deliberately failing runs per strategy.
        failure_kinds: the kinds they cycle through.
        seed: seeds the choice of flags and each run's ``trainer.seed``.

    Returns:
        The runs in the order to run them, indexed from 1.
    """
    rng = random.Random(seed)
    placed = []
    chosen = [s for s in STRATEGIES if s in counts and (counts[s] > 0 or failures > 0)]
    for rank, strategy in enumerate(chosen):
        runs = [(sources[(rank + k) % len(sources)], "normal") for k in range(counts[strategy])]
        for k in range(failures):
            kind = failure_kinds[(rank + k) % len(failure_kinds)]  # strategies alternate kinds
            runs.insert((k + 1) * len(runs) // (failures + 1),
                        ("csv" if kind == "bad_label" else sources[(rank + k) % len(sources)], kind))
        mlflow, hog = _flags(len(runs), mlflow_fraction, rng), _flags(len(runs), hog_fraction, rng)
        for k, (source, kind) in enumerate(runs):
            placed.append(((k + 0.5) / len(runs), rank, strategy, source, kind, mlflow[k], hog[k]))
    placed.sort(key=lambda p: (p[0], p[1]))
    return [RunSpec(index=i, strategy=strategy, source=source, mlflow=ml, hog=hog, kind=kind,
                    seed=rng.randrange(1, 2**31))
            for i, (_, _, strategy, source, kind, ml, hog) in enumerate(placed, start=1)]


def recipe(spec: RunSpec, *, data_dir: Path, run_dir: Path) -> dict:
    """The recipe of one run, as a dict (write it with :func:`write_recipe`).

    Args:
        spec: the run.
        data_dir: the folder :func:`write_data` filled.
        run_dir: the run's ``output.run_dir`` (must not exist yet).

    Returns:
        A recipe mapping: model, data, optimizer, strategy, cluster, trainer, output.
    """
    strategy, cluster = STRATEGY_SECTIONS[spec.strategy]
    model, data = _model_and_data(spec, data_dir)
    data.update(batch_size=BATCH, shuffle_buffer=256, shuffle_seed=spec.seed)
    output: dict = {"run_dir": str(run_dir), "tensorboard": False, "save_model": True}
    if spec.mlflow:
        output["tracking"] = {"kind": "mlflow", "experiment": "soak"}
    epochs = SIGINT_EPOCHS if spec.kind == "sigint" else EPOCHS
    return {"model": model, "data": data, "optimizer": {"name": "adam", "learning_rate": 0.01},
            "strategy": dict(strategy), "cluster": dict(cluster),
            "trainer": {"epochs": epochs, "steps_per_epoch": STEPS, "validation_steps": 1,
                        "seed": spec.seed, "verbose": 2},
            "output": output}


def _model_and_data(spec: RunSpec, data_dir: Path) -> tuple[dict, dict]:
    if spec.kind == "bad_label" or spec.source == "csv":
        folder = "csv_bad_label" if spec.kind == "bad_label" else "csv"
        return ({"name": "kerasdist.models.examples:tabular_mlp",
                 "params": {"num_features": 4, "num_classes": 2, "hidden": 8, "dropout": 0.0},
                 "loss": "sparse_categorical_crossentropy_from_logits", "metrics": ["accuracy"]},
                {"source": {"kind": "csv", "path": str(data_dir / folder / "{split}-*.csv"),
                            "label": "y"}, "train_split": "train", "eval_split": "test"})
    if spec.source == "image_folder":
        return ({"name": "kerasdist.models.examples:small_image_cnn",
                 "params": {"image_size": [8, 8], "channels": 1, "num_classes": 2, "dropout": 0.0},
                 "loss": "sparse_categorical_crossentropy_from_logits", "metrics": ["accuracy"]},
                {"source": {"kind": "image_folder", "path": str(data_dir / "images" / "{split}"),
                            "image_size": [8, 8], "channels": 1},
                 "train_split": "train", "eval_split": "test"})
    return ({"name": "linear"},
            {"source": {"kind": "synthetic_linear", "num_examples": 256}, "train_split": "train",
             "eval_split": "test"})


def write_recipe(path: Path, content: Mapping) -> Path:
    """Write ``content`` as JSON (a YAML subset ``kerasdist fit`` reads); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")
    return path


def png_gray(pixels: Sequence[Sequence[int]]) -> bytes:
    """Encode rows of 8-bit gray values as a PNG file (colour type 0, no filter, one IDAT).

    The format: the 8-byte signature, then chunks of (length, type, data, CRC-32 of type + data);
    IHDR holds width, height, bit depth 8, colour type 0; IDAT the zlib stream of each row
    prefixed by its filter byte 0 (W3C PNG specification, sections 5 and 11).
    """
    height, width = len(pixels), len(pixels[0])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + \
        chunk(b"IEND", b"")


def _write_csv(folder: Path, rng: random.Random, *, bad_label: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, files, rows in (("train", 4, 48), ("test", 1, 48)):
        for k in range(files):
            lines = ["a,b,c,d,y"]
            for i in range(rows):
                x = [rng.gauss(0.0, 1.0) for _ in range(4)]
                y = BAD_LABEL if bad_label and split == "train" and k == 0 and i == 5 else \
                    int(x[0] + x[1] > 0)
                lines.append(",".join(f"{v:.4f}" for v in x) + f",{y}")
            (folder / f"{split}-{k:03d}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_images(folder: Path, rng: random.Random) -> None:
    for split, per_class in (("train", 32), ("test", 8)):
        for label in (0, 1):  # class 0 bright on the left, class 1 on the right
            target = folder / split / f"class_{label}"
            target.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                rows = [[min(255, max(0, int(rng.gauss(180 if (col < 4) != bool(label) else 60, 30))))
                         for col in range(8)] for _ in range(8)]
                (target / f"{i:03d}.png").write_bytes(png_gray(rows))


def write_data(data_dir: Path, *, seed: int = 0) -> Path:
    """Write the soak's small data sets once: ``csv/`` (4 training files of 48 rows, 1 test file;
    columns a-d and the 0/1 label y), ``csv_bad_label/`` (the same layout with one training label
    of 7) and ``images/{train,test}/class_{0,1}/*.png`` (8x8 gray, 32 + 8 per class).

    Returns:
        ``data_dir``.
    """
    rng = random.Random(seed)
    _write_csv(data_dir / "csv", rng, bad_label=False)
    _write_csv(data_dir / "csv_bad_label", rng, bad_label=True)
    _write_images(data_dir / "images", rng)
    return data_dir
