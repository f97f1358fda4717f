#!/usr/bin/env python3
"""Write the files the csv and image recipes read (offline; nothing is downloaded).

* ``data/breast_cancer/{train,test}-NNN.csv`` for ``recipes/breast_cancer_csv.yaml``: the Breast
  Cancer Wisconsin (Diagnostic) data set as scikit-learn ships it (``sklearn.datasets.
  load_breast_cancer``: 569 tumours, 30 numeric features computed from images of fine-needle
  aspirates, label 0 = malignant, 1 = benign). Source: W. H. Wolberg, W. N. Street and
  O. L. Mangasarian (1995), "a copy of UCI ML Breast Cancer Wisconsin (Diagnostic)" (scikit-learn's
  own description), UCI Machine Learning Repository dataset 17
  (https://archive.ics.uci.edu/dataset/17), which UCI licenses CC BY 4.0 (not re-checked online
  from this offline machine); scikit-learn (BSD-3-Clause) ships it as
  ``sklearn/datasets/data/breast_cancer.csv``. A fixed permutation (seed 0) puts 455 rows (80 %) in
  ``train`` (4 files, so 2 workers can shard by file) and 114 in ``test``.
* ``data/mnist_rgb32/{train,test}/<digit>/<index>.png`` for ``recipes/mnist_rgb_image_folder.yaml``:
  the embedded real MNIST digits (the MNIST test set shipped in kerasdist, CC BY-SA 3.0; see
  ``kerasdist/data/sample/README.md``) resized to 32x32 (bilinear) and written as RGB PNG files
  in one folder per class, the layout ``keras.utils.image_dataset_from_directory`` reads: the
  first 8,000 digits are ``train``, the last 2,000 ``test`` (the split of recipes/mnist_cnn.yaml);
  ``kerasdist init images`` writes the same files (``kerasdist.cli_init.write_mnist_rgb``).
* The csv files are shipped in the package too (``kerasdist/templates/data/breast_cancer``, what
  ``kerasdist init csv`` writes; tests/unit/test_init.py checks they equal this script's).

Usage::

    pip install -e '.[recipes]'          # scikit-learn
    python tools/make_recipe_data.py     # [--out data] [--only csv|images]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kerasdist.cli_init import write_mnist_rgb  # also the data of `kerasdist init images`


def write_breast_cancer(out: Path) -> Path:
    """The csv recipe's files under ``out/breast_cancer``."""
    from sklearn.datasets import load_breast_cancer

    from kerasdist.data.writers import write_csv_splits

    bunch = load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(bunch.target))
    cut = int(0.8 * len(order))
    header = [name.replace(" ", "_") for name in bunch.feature_names] + ["diagnosis"]

    def rows(ids):
        return [[f"{v:.6g}" for v in bunch.data[i]] + [int(bunch.target[i])] for i in ids]

    folder = out / "breast_cancer"
    write_csv_splits(folder, header, {"train": rows(order[:cut])}, files_per_split=4)
    write_csv_splits(folder, header, {"test": rows(order[cut:])}, files_per_split=1)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--only", choices=["csv", "images"])
    args = parser.parse_args(argv)
    if args.only in (None, "csv"):
        print(f"wrote {write_breast_cancer(args.out)}")
    if args.only in (None, "images"):
        print(f"wrote {write_mnist_rgb(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
