"""Source ``tfds``: a prepared TensorFlow Datasets dataset, streamed as a function source
(``data.source.input`` / ``data.source.label`` name its features); read whole, without them, as
``tfds.load(as_supervised=True)`` pairs."""

from __future__ import annotations

from typing import Callable

from kerasdist.data.readers import as_labels
from kerasdist.data.sources.functions import FunctionKind
from kerasdist.errors import DataError


def tfds_function(config) -> Callable:
    """Source ``tfds`` as a data function: ``split -> (data.source.input, data.source.label)`` pairs of the
    prepared TFDS dataset ``data.source.name`` in ``data.source.data_dir`` (``tfds.builder(...).as_dataset``,
    files in order, ``shuffle_files=False``; TFDS slicing such as ``train[:80%]`` works). Nothing is
    downloaded here: a dataset not prepared in ``data_dir`` is refused.

    Raises:
        DataError: (when called) the dataset is not prepared, or lacks a named feature.
    """
    feature_in, feature_label = config.source.input or "image", config.source.label_name

    def load(split):
        import tensorflow_datasets as tfds

        try:
            builder = tfds.builder(config.source.name, data_dir=str(config.source.data_dir)
                                   if config.source.data_dir else None)
            ds = builder.as_dataset(split=split, shuffle_files=False)
        except Exception as err:  # noqa: BLE001 - TFDS raises many types
            first = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(f"data.source 'tfds': cannot read '{config.source.name}' split "
                            f"'{split}' from data.source.data_dir '{config.source.data_dir}': "
                            f"{first}. Prepare it there first "
                            f"(tfds build / builder.download_and_prepare()). Received: "
                            f"name='{config.source.name}'") from None
        for field, name in (("data.source.input", feature_in), ("data.source.label", feature_label)):
            if name not in ds.element_spec:
                raise DataError(f"{field}: '{config.source.name}' has no feature '{name}' (features: "
                                f"{', '.join(ds.element_spec)}). Received: '{name}'")
        return ds.map(lambda f: (f[feature_in], f[feature_label]))

    return load


class TfdsKind(FunctionKind):
    kind = "tfds"

    def function(self, config):
        return tfds_function(config)

    def load(self, config, split):
        if config.source.input is not None or config.source.label is not None:
            return super().load(config, split)
        import tensorflow_datasets as tfds

        try:
            ds = tfds.load(config.source.name, split=split, as_supervised=True, batch_size=-1,
                           data_dir=str(config.source.data_dir) if config.source.data_dir else None)
        except Exception as err:  # noqa: BLE001 - TFDS raises many types (network, registration)
            raise DataError(f"data.source 'tfds': cannot load '{config.source.name}' split '{split}': "
                            f"{err}. Offline? Use data.source: embedded.") from None
        x, y = tfds.as_numpy(ds)
        if x.ndim == 4 and x.shape[-1] == 1:
            x = x[..., 0]
        return x, as_labels(y, f"data.source 'tfds' '{config.source.name}' split '{split}'")
