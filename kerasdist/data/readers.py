"""The readers of the in-memory formats and of the MNIST TFRecord layout: leaf functions (no other
``kerasdist.data`` module is imported) that the source kinds call: the embedded MNIST test set
(:func:`embedded_dir`; provenance: ``sample/README.md``), IDX files, a Keras ``mnist.npz``, the
TFRecord layout ``image_raw`` (raw uint8 square image) + ``label`` (int64), the synthetic splits,
and :func:`corrupt_file`. Images are ``uint8`` ``(N, 28, 28)``, labels ``int64`` ``(N,)``; the
linear source gives ``float32`` ``x`` and ``y`` of shape ``(N, 1)``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from kerasdist.errors import DataError

MNIST_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
LINEAR_W, LINEAR_B = 2.0, 10.0  # seed 001: y = 2x + 10


def embedded_dir() -> Path:
    """Folder of the embedded MNIST sample inside the installed package."""
    return Path(str(resources.files("kerasdist.data") / "sample"))


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (gzipped or not) into a NumPy array of its declared shape and dtype.

    Raises:
        DataError: the file is not IDX (wrong magic) or truncated.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read IDX file '{path}': {err}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"'{path}' is not an IDX file of uint8 (bad magic). Received: {raw[:4]!r}")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(raw) - offset != expected:
        raise DataError(f"IDX file '{path}' is truncated: header says {expected} bytes of data, "
                        f"found {len(raw) - offset}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise DataError(f"data.source.path: '{folder}' has no '{stem}' or '{stem}.gz'")


def load_idx_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """MNIST IDX ``split`` ('train' or 'test') from ``folder``."""
    if split not in MNIST_IDX_FILES:
        raise DataError(f"split '{split}' is not an MNIST IDX split; available: train, test")
    images_stem, labels_stem = MNIST_IDX_FILES[split]
    x = read_idx(_find(folder, images_stem))
    y = read_idx(_find(folder, labels_stem)).astype(np.int64)
    if len(x) != len(y):
        raise DataError(f"'{folder}': {len(x)} images but {len(y)} labels for split '{split}'")
    return x, y


def as_labels(y: np.ndarray, where: str) -> np.ndarray:
    """``y`` as int64 class labels; float labels must be finite whole numbers (a NaN cast to
    int64 would silently become -9223372036854775808).

    Raises:
        DataError: naming ``where`` and the first bad label.
    """
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating) and y.size:
        bad = ~np.isfinite(y) | (np.nan_to_num(y) != np.round(np.nan_to_num(y)))
        if bad.any():
            first = int(np.argmax(bad.reshape(-1)))
            raise DataError(f"{where}: labels must be whole class numbers; {int(bad.sum())} are not "
                            f"(first at index {first}). Received: {y.reshape(-1)[first].item()!r}")
    return y.astype(np.int64)


def load_npz_split(path: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Split from a Keras ``mnist.npz`` (keys ``x_<split>``, ``y_<split>``).

    Raises:
        DataError: the file is missing, not an npz archive (a zip of ``.npy`` arrays, as
            ``numpy.savez`` writes), lacks the split's arrays, or their lengths differ.
    """
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as err:
        raise DataError(f"data.source.path: cannot read npz file '{path}': {err}") from None
    if magic != b"PK\x03\x04":  # every zip file, so every npz archive, starts so
        raise DataError(f"data.source.path: '{path}' is not an npz archive (a zip of .npy arrays "
                        f"as numpy.savez writes). Received: path='{path}'")
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
            if f"x_{split}" not in keys or f"y_{split}" not in keys:
                raise DataError(f"data.source.path: '{path}' has no x_{split}/y_{split} arrays "
                                f"(found: {', '.join(sorted(keys))})")
            x, y = archive[f"x_{split}"], archive[f"y_{split}"]
    except (OSError, ValueError, EOFError, zlib.error) as err:
        raise DataError(f"data.source.path: cannot read npz file '{path}': {err}") from None
    if len(x) != len(y):
        raise DataError(f"data.source.path '{path}': {len(x)} examples in x_{split} but {len(y)} labels "
                        f"in y_{split}")
    return x, as_labels(y, f"data.source.path '{path}' y_{split}")


def _seed_spec() -> dict:
    """``tf.io`` parse spec of the seed schema: ``image_raw`` bytes, ``label`` int64."""
    import tensorflow as tf

    return {"image_raw": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}


def parse_square_image(record):
    """One serialized record of the seed schema -> (uint8 image ``(side, side)``, int64 label)."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(record, _seed_spec())
    image = tf.io.decode_raw(parsed["image_raw"], tf.uint8)
    side = tf.cast(tf.round(tf.sqrt(tf.cast(tf.size(image), tf.float32))), tf.int32)
    return tf.reshape(image, [side, side]), parsed["label"]


def parse_square_images(records):
    """A batch of seed-layout records -> (uint8 ``(b, side, side)``, int64 ``(b,)``)."""
    import tensorflow as tf

    parsed = tf.io.parse_example(records, _seed_spec())
    images = tf.io.decode_raw(parsed["image_raw"], tf.uint8)
    side = tf.cast(tf.round(tf.sqrt(tf.cast(tf.shape(images)[1], tf.float32))), tf.int32)
    return tf.reshape(images, [-1, side, side]), parsed["label"]


def tf_message(err) -> str:
    """The first line of a TensorFlow error, without its ``{{function_node ...}}`` prefix."""
    text = str(getattr(err, "message", err)).strip().splitlines()
    text = text[0] if text else type(err).__name__
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)[:300]


def corrupt_file(path: str, err) -> DataError:
    """A ``DataError`` for a TFRecord file TensorFlow cannot read to its end (``DataLossError``:
    truncated, or a bad checksum), naming the file and the byte offset TensorFlow gives."""
    detail = re.sub(r"\s*\[Op:\w+\].*$", "", tf_message(err), flags=re.S)  # TF's op and name
    offset = re.search(r"(?:record|corrupted record) at (\d+)", detail)
    where = f" at byte {offset.group(1)}" if offset else ""
    reason = detail.split(" failed with ", 1)[-1].strip(" '.:")
    return DataError(f"data.source.path: TFRecord file '{path}' is truncated or corrupt{where} (written "
                     f"partly, or damaged): {reason}. Received: file '{path}'")


def load_tfrecord_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Split from ``<folder>/<split>*.tfrecord*`` in the seed schema, as uint8 ``(N, H, W)`` images
    and int64 ``(N,)`` labels (parsed with :func:`parse_square_image`).

    Raises:
        DataError: no files, no records, or records that do not parse.
    """
    import tensorflow as tf

    files = sorted(str(p) for p in Path(folder).glob(f"{split}*.tfrecord*"))
    if not files:
        raise DataError(f"data.source.path: '{folder}' has no '{split}*.tfrecord*' files for split '{split}'")
    images, labels = [], []
    for path in files:
        try:
            for image, label in tf.data.TFRecordDataset([path]).map(parse_square_image).batch(4096):
                images.append(image.numpy())
                labels.append(label.numpy())
        except tf.errors.DataLossError as err:
            raise corrupt_file(path, err) from None
        except tf.errors.OpError as err:
            raise DataError(f"data.source.path: cannot parse the TFRecords of '{path}': "
                            f"{err.message.splitlines()[0][:300]}") from None
    if not images:
        raise DataError(f"data.source.path: the '{split}*.tfrecord*' files in '{folder}' hold no records")
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


def write_tfrecord(x: np.ndarray, y: np.ndarray, path: str | Path) -> Path:
    """Write uint8 images ``(N, H, W)`` and int labels ``(N,)`` in the seed TFRecord schema."""
    import tensorflow as tf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for image, label in zip(np.asarray(x, np.uint8), np.asarray(y), strict=True):
            feature = {
                "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                         .SerializeToString())
    return path


def synthetic_linear(split: str, *, num_examples: int, noise_std: float, seed: int):
    """The seed-001 data: ``x ~ N(0,1)``, ``y = 2x + 10 + N(0, noise_std^2)``; float32 (N, 1)."""
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    x = rng.standard_normal((num_examples, 1)).astype(np.float32)
    y = (LINEAR_W * x + LINEAR_B + rng.standard_normal((num_examples, 1)) * noise_std)
    return x, y.astype(np.float32)


def synthetic_clicks(split: str, *, num_examples: int, num_users: int, num_items: int,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic click logs (no real data; offline): ``x`` int64 ``(N, 2)`` = ``[user, item]``,
    ``y`` float32 ``(N, 1)`` in {0, 1}.

    Items are drawn from a Zipf-like law (a few items get most impressions, as in real logs;
    exponent 1.1 over the ids), users uniformly. Each user and item has a hidden taste
    ``t ~ N(0, 1)``; a click happens with probability ``sigmoid(t_user + 2.5 t_item)``, so a
    model that learns both tables' rows can reach the Bayes rate (about 0.8 accuracy), one that
    learns nothing stays near 0.5. The hidden tastes depend only on ``seed``; the impressions on
    ``seed`` and ``split``.
    """
    tastes = np.random.default_rng([seed, 7])
    user_taste = tastes.standard_normal(num_users).astype(np.float32)
    item_taste = tastes.standard_normal(num_items).astype(np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    users = rng.integers(0, num_users, num_examples)
    ranks = np.arange(1, num_items + 1, dtype=np.float64)
    weights = ranks ** -1.1
    items = rng.choice(num_items, size=num_examples, p=weights / weights.sum())
    logits = 1.0 * user_taste[users] + 2.5 * item_taste[items]
    clicks = rng.random(num_examples) < 1.0 / (1.0 + np.exp(-logits))
    return (np.stack([users, items], axis=1).astype(np.int64),
            clicks.astype(np.float32)[:, None])
