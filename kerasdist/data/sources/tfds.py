"""Source ``tfds``: a prepared TensorFlow Datasets dataset, streamed as a function source
(``data.source.input`` / ``data.source.label`` name its features); read whole, without them, as
``tfds.load(as_supervised=True)`` pairs."""

from __future__ import annotations

from kerasdist.data import python_source
from kerasdist.data.readers import as_labels
from kerasdist.data.sources.base import FunctionKind
from kerasdist.errors import DataError


class TfdsKind(FunctionKind):
    kind = "tfds"

    def function(self, config):
        return python_source.tfds_function(config)

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
