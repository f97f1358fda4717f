"""Source ``image_folder``: ``<split>/<class_name>/**/*.png|jpg``, read as
``keras.utils.image_dataset_from_directory`` reads it
(:class:`~kerasdist.data.image_folder_source.ImageFolderSource`)."""

from __future__ import annotations

from kerasdist.data.image_folder_source import ImageFolderSource
from kerasdist.data.sources.base import FileKind


class ImageFolderKind(FileKind):
    kind = "image_folder"
    source_class = ImageFolderSource
