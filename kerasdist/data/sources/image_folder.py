"""Source ``image_folder``: one class folder per label under ``<path>/<split>/``
(``<split>/<class_name>/**/*.png|jpg``), read as ``keras.utils.image_dataset_from_directory``
reads it (the same files, class order and ids; hidden entries skipped, sub-folders read), every
image one unit (a file), decoded with ``tf.io.decode_image`` and resized with
``tf.image.resize``; :class:`ImageFolderSource` implements the
:class:`~kerasdist.data.sources.files.FileSource` protocol."""

from __future__ import annotations

from pathlib import Path

from kerasdist.data.sources.files import CHECKED_RECORDS, FileKind, FileSource, path_where
from kerasdist.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""The image files ``image_folder`` reads (those ``image_dataset_from_directory`` reads)."""
CLASS_SEP = "\x00"
"""Separates an image file from its class name in an ``image_folder`` unit (``path<SEP>class``)."""


def image_files(folder: Path) -> list[tuple[str, str]]:
    """``[(path, class name)]`` of an image folder split, as
    ``keras.utils.image_dataset_from_directory`` indexes it (``labels='inferred'``): the classes
    are the sub-folders whose names do not start with ``.``; a class's images are every file
    with an image extension (any case) anywhere below its folder (``os.walk``, symbolic links to
    folders not followed). Sorted by path."""
    import os

    found = []
    for name in class_names(folder):
        for root, _, files in os.walk(folder / name):
            found += [(os.path.join(root, f), name) for f in files
                      if f.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(found)


def class_names(folder: Path) -> list[str]:
    """The class folders of a split, as Keras lists them (sorted, no hidden folder)."""
    import os

    if not folder.is_dir():
        return []
    return [n for n in sorted(os.listdir(folder)) if not n.startswith(".") and (folder / n).is_dir()]


def _image_size(path: str) -> tuple[int, int, int]:
    """``(height, width, channels)`` of an image file from its header (Pillow, lazily: the
    pixels are not decoded)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            width, height = image.size
            return height, width, len(image.getbands())
    except (OSError, UnidentifiedImageError) as err:
        raise DataError(f"data.source.path: '{path}' is not a readable image: {err}. Received: file "
                        f"'{path}'") from None


class ImageFolderSource(FileSource):
    """``<path>/<split>/<class_name>/**/*.png|jpg`` (see :func:`image_files`): classes are the
    training split's class folders, ids in sorted order (``keras.utils.image_dataset_from_directory``'s
    ids); ``x`` is float32 ``(height, width, channels)`` (in [0, 1] when ``data.normalize``, else
    [0, 255]), ``y`` int64. Without ``data.source.image_size`` (and ``data.source.channels``), they are the
    first training image's, logged, and every image must have that size; with it, every image is
    resized to it (bilinear, as Keras)."""

    classes: list[str] | None = None
    image_size: tuple[int, int] | None = None
    channels: int | None = None

    def folder(self, split: str) -> Path:
        path = str(self.config.source.path)
        return Path(path.replace("{split}", split)) if "{split}" in path else Path(path) / split

    def searched(self, split: str) -> str:
        return str(self.folder(split))

    def open(self, run_dir) -> list[str]:
        self.set_classes(self.config.train_split)
        return self.check(self.config.train_split)

    def set_classes(self, train_split: str) -> list[str]:
        """The training split's classes, and the image size and channels every example gets."""
        folder = self.folder(train_split)
        self.classes = class_names(folder)
        if not self.classes:
            raise DataError(f"data.source.path: {path_where(folder)} holds no class folders "
                            f"(<class_name>/*.png|jpg) for split '{train_split}'. Received: "
                            f"path='{self.config.source.path}'")
        self.image_size, self.channels = self.config.source.image_size, self.config.source.channels
        if self.image_size is None or self.channels is None:
            files = image_files(folder)
            if not files:
                super().check(train_split)
            height, width, channels = _image_size(files[0][0])
            self.image_size = self.image_size or (height, width)
            self.channels = self.channels or (channels if channels in (1, 3, 4) else 3)
            from kerasdist._log import get_logger

            get_logger("data").info(
                f"input: image_folder: data.source.image_size {list(self.image_size)} and "
                f"data.source.channels {self.channels} taken from the first training image "
                f"'{files[0][0]}' (set them to resize every image)")
        return self.classes

    def units(self, split):
        return [f"{path}{CLASS_SEP}{name}" for path, name in image_files(self.folder(split))]

    def check(self, split):
        units = super().check(split)
        unknown = sorted({u.split(CLASS_SEP)[1] for u in units} - set(self.classes))
        if unknown:
            raise DataError(f"data.source.path: split '{split}' has class folders the training split has "
                            f"not ({', '.join(unknown[:5])}) in '{self.folder(split)}'. Received: "
                            f"classes {unknown[:5]}")
        import tensorflow as tf

        if self.config.source.image_size is None:  # no resize: every image must have the same size
            for unit in units:
                path = unit.split(CLASS_SEP)[0]
                size = _image_size(path)[:2]
                if size != tuple(self.image_size):
                    raise DataError(
                        f"data.source.image_size: '{path}' is {size[0]}x{size[1]}, other images "
                        f"{self.image_size[0]}x{self.image_size[1]} (taken from the first "
                        "training image): images of mixed sizes need data.source.image_size (every "
                        f"image is then resized to it). Received: image_size=None")
        for unit in units[:CHECKED_RECORDS]:
            path = unit.split(CLASS_SEP)[0]
            try:
                tf.io.decode_image(tf.io.read_file(path), channels=self.channels,
                                   expand_animations=False)
            except tf.errors.OpError as err:
                raise DataError(f"data.source.path: '{path}' is not a readable image: "
                                f"{err.message.splitlines()[0][:200]}. Received: file '{path}'") \
                    from None
        return units

    def records(self, units):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(units)

    def decoder(self):
        import tensorflow as tf

        config, size, channels = self.config, tuple(self.image_size), self.channels
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.classes), tf.range(len(self.classes), dtype=tf.int64)), -1)
        scale = 255.0 if config.normalize else 1.0
        resize = config.source.image_size is not None

        def decode(unit):
            parts = tf.strings.split(unit, CLASS_SEP)
            image = tf.io.decode_image(tf.io.read_file(parts[0]), channels=channels,
                                       expand_animations=False)
            image = tf.image.resize(image, size) if resize else tf.cast(image, tf.float32)
            return tf.ensure_shape(image / scale, (*size, channels)), table.lookup(parts[1])

        return decode

    def count(self, units):
        return [1] * len(units)


class ImageFolderKind(FileKind):
    kind = "image_folder"
    source_class = ImageFolderSource
