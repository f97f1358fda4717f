"""The seed tutorials' two models as Keras 3 ``Sequential`` builders.

Both return *uncompiled* models; build and compile them inside ``strategy.scope()`` so their variables
are created by the strategy (mirrored, or placed on parameter servers).
"""

from __future__ import annotations


def mnist_cnn(*, dropout: float = 0.5, num_classes: int = 10, input_shape=(28, 28, 1)):
    """The seed MNIST CNN (TensorFlow "Deep MNIST for experts" layout, seeds 000 and 004).

    conv 5x5x32 same + ReLU -> max-pool 2x2 -> conv 5x5x64 same + ReLU -> max-pool 2x2 ->
    dense 1024 ReLU -> dropout -> dense ``num_classes`` logits.

    Args:
        dropout: fraction of the 1024 units dropped while training (seed: keep_prob 0.5).
        num_classes: number of output logits.
        input_shape: per-example input shape, ``(28, 28, 1)`` float32 in [0, 1] for MNIST.

    Returns:
        An uncompiled ``keras.Sequential``; input ``(batch, 28, 28, 1)`` float32, output
        ``(batch, num_classes)`` float32 logits. 3,274,634 parameters for MNIST.

    Raises:
        ValueError: ``dropout`` outside [0, 1).
    """
    import keras

    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.params.dropout must be in [0, 1). Received: dropout={dropout}")
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(1024, activation="relu"),
            layers.Dropout(dropout),
            layers.Dense(num_classes),
        ],
        name="mnist_cnn",
    )


def linear(*, units: int = 1):
    """The seed linear regression ``y = W x + b`` (seed 001): one weight and one bias.

    Returns:
        An uncompiled ``keras.Sequential``; input ``(batch, 1)`` float32, output ``(batch, units)``.
        ``model.layers[0].kernel`` is W (shape ``(1, units)``), ``.bias`` is b.
    """
    import keras

    return keras.Sequential(
        [keras.Input(shape=(1,)), keras.layers.Dense(units, name="wx_plus_b")], name="linear"
    )
