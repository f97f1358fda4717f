"""Small example builders for the shipped tabular and image recipes, named by import path
(``model.name: kerasdist.models.examples:tabular_mlp``), the way a user names their own."""

from __future__ import annotations


def tabular_mlp(*, num_features: int, num_classes: int = 2, hidden: int = 64,
                dropout: float = 0.1):
    """Two hidden ReLU layers over a float32 feature vector (a ``csv`` source's ``x``).

    Args:
        num_features: width of ``x`` (numeric columns + one-hot slots of the categorical ones).
        num_classes: output logits.
        hidden: units of each hidden layer.
        dropout: fraction dropped after each hidden layer while training.

    Returns:
        An uncompiled ``keras.Sequential``: input ``(batch, num_features)`` float32, output
        ``(batch, num_classes)`` logits.
    """
    import keras

    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(num_features,)),
        layers.Dense(hidden, activation="relu"), layers.Dropout(dropout),
        layers.Dense(hidden, activation="relu"), layers.Dropout(dropout),
        layers.Dense(num_classes),
    ], name="tabular_mlp")


def small_image_cnn(*, image_size=(32, 32), channels: int = 3, num_classes: int = 10,
                    dropout: float = 0.25):
    """Two conv blocks and a dense head over float32 images (an ``image_folder`` source's ``x``).

    Returns:
        An uncompiled ``keras.Sequential``: input ``(batch, height, width, channels)`` float32 in
        [0, 1], output ``(batch, num_classes)`` logits.
    """
    import keras

    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(*image_size, channels)),
        layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dropout(dropout),
        layers.Dense(128, activation="relu"),
        layers.Dense(num_classes),
    ], name="small_image_cnn")
