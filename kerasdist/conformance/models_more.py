"""More conformance models: losses added by layers, a frozen sub-model, masking, attention,
augmentation layers and a KerasHub backbone (issue 29's widened matrix).

Each builder takes the case's data (:func:`kerasdist.conformance.data.make`) and returns an
uncompiled ``keras.Model``.
"""

from __future__ import annotations

from kerasdist.conformance.data import CLASSES, FEATURES, SEQ_LEN, VOCAB


def _activity_penalty_class():
    import keras

    @keras.saving.register_keras_serializable(package="kerasdist_conformance")
    class ActivityPenalty(keras.layers.Layer):
        """Identity that calls ``add_loss(0.01 * mean(x**2))``."""

        def call(self, inputs):
            self.add_loss(0.01 * keras.ops.mean(keras.ops.square(inputs)))
            return inputs

    return ActivityPenalty


def add_loss_regularized(data=None, *, activity=False, penalty=True):
    """Dense(16, L2 kernel regularizer[, L1 activity regularizer]) [-> ``add_loss`` layer] ->
    Dense(3)."""
    import keras

    extra = {"activity_regularizer": keras.regularizers.L1(1e-3)} if activity else {}
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2),
                           **extra),
        *([_activity_penalty_class()()] if penalty else []),
        keras.layers.Dense(CLASSES)])


def add_loss_layer(data=None):
    """Dense(16) -> a layer that calls ``add_loss(0.01 * mean(x**2))`` -> Dense(3)."""
    import keras

    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                             _activity_penalty_class()(), keras.layers.Dense(CLASSES)])


def frozen_submodel(data=None):
    """A frozen ``Dense -> BatchNormalization`` sub-model (inference-mode BN) under a trained head."""
    import keras

    inner = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(), keras.layers.Activation("relu")],
                             name="frozen")
    inner.trainable = False
    return keras.Sequential([keras.Input((FEATURES,)), inner, keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(CLASSES)])


def masked_lstm(data=None):
    """``Embedding(mask_zero=True)`` -> LSTM(8) -> Dense(3), on zero-padded token sequences."""
    import keras

    return keras.Sequential([keras.Input((SEQ_LEN,), dtype="int64"),
                             keras.layers.Embedding(VOCAB, 8, mask_zero=True),
                             keras.layers.LSTM(8), keras.layers.Dense(CLASSES)])


def attention(data=None):
    """Embedding -> self-attention (``MultiHeadAttention``, 2 heads) -> pooling -> Dense(3)."""
    import keras

    tokens = keras.Input((SEQ_LEN,), dtype="int64")
    embedded = keras.layers.Embedding(VOCAB, 8)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(embedded, embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Add()([embedded, attended]))
    return keras.Model(tokens, keras.layers.Dense(CLASSES)(pooled))


def augmented(data=None):
    """RandomFlip + RandomTranslation on 8x8x1 images (active in training only) -> Conv -> Dense."""
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.RandomFlip("horizontal"),
                             keras.layers.RandomTranslation(0.1, 0.1),
                             keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                             keras.layers.Dense(CLASSES)])


def kerashub_bert(data=None):
    """An untrained ``keras_hub.models.BertBackbone`` from its config (1 layer, hidden 8, no
    dropout; no weights downloaded), its pooled output -> Dense(3)."""
    import keras
    import keras_hub

    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, dropout=0.0,
                                             max_sequence_length=SEQ_LEN)
    inputs = {name: keras.Input((SEQ_LEN,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    pooled = backbone(inputs)["pooled_output"]
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(pooled))
