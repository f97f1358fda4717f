"""Writers of the streaming sources' file layouts (for tests, examples and the shipped recipes'
data: ``tools/make_recipe_data.py``).

* :func:`write_csv_splits`: a table as ``<folder>/<split>-<k>.csv`` files with a header row;
* :func:`write_image_folder`: images as ``<folder>/<split>/<class>/<i>.png`` (the layout of
  ``keras.utils.image_dataset_from_directory``), resized and turned to RGB on the way;
* :func:`write_example_tfrecords`: ``tf.train.Example`` files of any feature spec.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


def write_csv_splits(folder: str | Path, header: Sequence[str], rows_by_split: Mapping[str, Sequence],
                     *, files_per_split: int = 1) -> dict[str, list[Path]]:
    """Write each split's rows as ``files_per_split`` CSV files (rows dealt out in turn).

    Args:
        folder: created if missing.
        header: the column names (first line of every file).
        rows_by_split: ``{split: rows}``, each row a sequence of ``len(header)`` values.
        files_per_split: files per split (>= 1).

    Returns:
        ``{split: [paths]}``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for split, rows in rows_by_split.items():
        paths = [folder / f"{split}-{k:03d}.csv" for k in range(files_per_split)]
        handles = [open(p, "w", newline="", encoding="utf-8") for p in paths]
        try:
            writers = [csv.writer(h) for h in handles]
            for w in writers:
                w.writerow(list(header))
            for i, row in enumerate(rows):
                writers[i % files_per_split].writerow(list(row))
        finally:
            for h in handles:
                h.close()
        written[split] = paths
    return written


def write_image_folder(folder: str | Path, split: str, images: np.ndarray, labels: np.ndarray, *,
                       size: tuple[int, int] | None = None, rgb: bool = True,
                       class_names: Sequence[str] | None = None) -> Path:
    """Write uint8 images as PNG files ``<folder>/<split>/<class>/<index>.png``.

    Args:
        images: uint8 ``(N, H, W)`` or ``(N, H, W, C)``.
        labels: int ``(N,)`` class ids; the folder of id ``k`` is ``class_names[k]`` (default
            ``'k'``, zero-padded to sort like the ids).
        size: ``(height, width)`` to resize to (bilinear, ``tf.image.resize``); None keeps it.
        rgb: write 3 channels (a grayscale image is repeated over them).

    Returns:
        The split's folder.
    """
    import tensorflow as tf

    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    width = len(str(int(np.max(labels)))) if len(labels) else 1
    root = Path(folder) / split
    for index, (image, label) in enumerate(zip(images, np.asarray(labels), strict=True)):
        name = class_names[int(label)] if class_names else f"{int(label):0{width}d}"
        tensor = tf.convert_to_tensor(image)
        if size is not None:
            tensor = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(tensor, size)), 0, 255),
                             tf.uint8)
        if rgb and tensor.shape[-1] == 1:
            tensor = tf.image.grayscale_to_rgb(tensor)
        path = root / name / f"{index:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(tensor).numpy())
    return root


def _feature(value, dtype: str):
    import tensorflow as tf

    if dtype == "string":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    flat = np.asarray(value).reshape(-1)
    if dtype == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in flat]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in flat]))


def write_example_tfrecords(path: str | Path, examples: Sequence[Mapping[str, object]],
                            dtypes: Mapping[str, str]) -> Path:
    """Write ``tf.train.Example`` records, one per mapping ``{feature: value}``.

    Args:
        dtypes: ``{feature: 'float32' | 'int64' | 'string'}``; ``string`` values are bytes.
    """
    import tensorflow as tf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            feature = {k: _feature(v, dtypes[k]) for k, v in example.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                         .SerializeToString())
    return path
