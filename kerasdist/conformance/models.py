"""Model builders of the conformance cases: ordinary Keras 3 code, as users write it.

Every builder takes the case's NumPy data (for preprocessing layers adapted before training) and
returns an **uncompiled** model; :mod:`kerasdist.conformance.cases` compiles it. Builders are
called inside the strategy's scope.
"""

from __future__ import annotations

from kerasdist.conformance.data import CLASSES, FEATURES, SEQ_LEN, VOCAB, WIDE_VOCAB


def dense(data=None, *, hidden=16, extra=(), out=CLASSES, activation=None):
    """Sequential ``Input(8) -> [extra layers] -> Dense(hidden, relu) -> Dense(out)``."""
    import keras

    layers = [keras.Input((FEATURES,)), *extra, keras.layers.Dense(hidden, activation="relu"),
              keras.layers.Dense(out, activation=activation)]
    return keras.Sequential(layers)


def batchnorm(data=None, *, synchronized=False):
    import keras

    return dense(extra=(keras.layers.Dense(16), keras.layers.BatchNormalization(
        synchronized=synchronized), keras.layers.Activation("relu")))


def dropout(data=None):
    import keras

    return dense(extra=(keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3)))


def layernorm(data=None):
    import keras

    return dense(extra=(keras.layers.Dense(16), keras.layers.LayerNormalization()))


def sequence(data=None, *, rnn="none", vocab=VOCAB):
    """``Embedding(vocab, 8)`` -> LSTM(8) / GRU(8) / average pooling -> Dense(3)."""
    import keras

    layers = [keras.Input((SEQ_LEN,), dtype="int64"), keras.layers.Embedding(vocab, 8)]
    if rnn == "lstm":
        layers.append(keras.layers.LSTM(8))
    elif rnn == "gru":
        layers.append(keras.layers.GRU(8))
    else:
        layers.append(keras.layers.GlobalAveragePooling1D())
    return keras.Sequential([*layers, keras.layers.Dense(CLASSES)])


def normalization(data):
    import keras

    norm = keras.layers.Normalization()
    norm.adapt(data["x"])
    return dense(extra=(norm,))


def string_lookup(data):
    """One word per example -> ``StringLookup(one_hot)`` (adapted) -> Dense."""
    import keras

    lookup = keras.layers.StringLookup(output_mode="one_hot")
    lookup.adapt(data["x"])
    inputs = keras.Input((1,), dtype="string")
    hidden = keras.layers.Dense(16, activation="relu")(lookup(inputs))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def integer_lookup(data):
    import keras

    lookup = keras.layers.IntegerLookup(output_mode="one_hot")
    lookup.adapt(data["x"])
    inputs = keras.Input((1,), dtype="int64")
    hidden = keras.layers.Dense(16, activation="relu")(lookup(inputs))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def text_vectorization(data):
    import keras

    vectorize = keras.layers.TextVectorization(max_tokens=32, output_mode="int",
                                               output_sequence_length=3)
    vectorize.adapt(data["x"][:, 0])
    inputs = keras.Input((1,), dtype="string")
    tokens = vectorize(keras.layers.Reshape(())(inputs))
    embedded = keras.layers.Embedding(32, 8)(tokens)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(pooled))


def multi_hot_pipeline(data):
    """A ``TextVectorization(multi_hot, max_tokens=8)`` adapted on the strings: ``x -> [8]``."""
    import keras

    vectorize = keras.layers.TextVectorization(max_tokens=FEATURES, output_mode="multi_hot")
    vectorize.adapt(data["x"][:, 0])
    return lambda x: vectorize(x[:, 0])


def normalization_pipeline(data):
    """A ``Normalization`` adapted on ``x``, applied in the pipeline."""
    import keras

    norm = keras.layers.Normalization()
    norm.adapt(data["x"])
    return norm


def functional_multi_io(data=None):
    """Two inputs (``a`` [8], ``b`` [4]) and two outputs (``cls`` logits [3], ``reg`` [1])."""
    import keras

    a = keras.Input((FEATURES,), name="a")
    b = keras.Input((4,), name="b")
    joined = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(a), b])
    hidden = keras.layers.Dense(16, activation="relu")(joined)
    return keras.Model({"a": a, "b": b}, {"cls": keras.layers.Dense(CLASSES, name="cls")(hidden),
                                          "reg": keras.layers.Dense(1, name="reg")(hidden)})


def _subclassed_class():
    import keras

    @keras.saving.register_keras_serializable(package="kerasdist_conformance")
    class TwoLayer(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(CLASSES)

        def call(self, inputs, training=False):
            return self.out(self.hidden(inputs))

    return TwoLayer


def subclassed(data=None):
    import numpy as np

    model = _subclassed_class()()
    model(np.zeros((1, FEATURES), np.float32))  # creates the sublayers' weights
    return model


def _custom_step_class():
    import keras
    import tensorflow as tf

    @keras.saving.register_keras_serializable(package="kerasdist_conformance")
    class CustomStep(keras.Sequential):
        """The pattern of Keras's "Customizing what happens in fit()" guide (TensorFlow)."""

        def _update_metrics(self, loss, y, y_pred):
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def train_step(self, data):
            x, y = data[:2]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return self._update_metrics(loss, y, y_pred)

        def test_step(self, data):
            x, y = data[:2]
            y_pred = self(x, training=False)
            return self._update_metrics(self.compute_loss(y=y, y_pred=y_pred), y, y_pred)

    return CustomStep


def custom_step(data=None):
    import keras

    return _custom_step_class()([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(CLASSES)])


def _custom_loss_class():
    import keras

    @keras.saving.register_keras_serializable(package="kerasdist_conformance")
    class CustomLoss(keras.Sequential):
        """``compute_loss`` overridden: the compiled loss plus an L2 term on the outputs."""

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                        training=training)
            return loss + 0.01 * keras.ops.mean(keras.ops.square(y_pred))

    return CustomLoss


def custom_compute_loss(data=None):
    import keras

    return _custom_loss_class()([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(CLASSES)])


def _custom_metric_class():
    import keras

    @keras.saving.register_keras_serializable(package="kerasdist_conformance")
    class MaxAbsError(keras.metrics.Metric):
        """A custom ``keras.metrics.Metric``: a weighted sum of |error| and the weight total."""

        def __init__(self, name="mean_abs_err", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable((), "zeros", name="total")
            self.weight = self.add_variable((), "zeros", name="weight")

        def update_state(self, y_true, y_pred, sample_weight=None):
            ops = keras.ops
            err = ops.abs(ops.reshape(ops.cast(y_true, "float32"), (-1,))
                          - ops.reshape(ops.cast(y_pred, "float32"), (-1,)))
            w = ops.ones_like(err) if sample_weight is None else ops.cast(
                ops.reshape(sample_weight, (-1,)), "float32")
            self.total.assign_add(ops.sum(err * w))
            self.weight.assign_add(ops.sum(w))

        def result(self):
            return keras.ops.divide_no_nan(self.total, self.weight)

        def reset_state(self):
            self.total.assign(0.0)
            self.weight.assign(0.0)

    return MaxAbsError


def custom_metric():
    return _custom_metric_class()()


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


def conv_pooling(data=None):
    """Conv2D(4, 3) -> MaxPooling2D -> Conv2D(4, 2) -> GlobalMaxPooling2D -> Dense(3) on 8x8x1 images."""
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.MaxPooling2D(2), keras.layers.Conv2D(4, 2),
                             keras.layers.GlobalMaxPooling2D(), keras.layers.Dense(CLASSES)])


def bidirectional(data=None):
    """``Embedding(200, 8)`` -> ``Bidirectional(LSTM(4))`` -> Dense(3), on wide token ids."""
    import keras

    return keras.Sequential([keras.Input((SEQ_LEN,), dtype="int64"),
                             keras.layers.Embedding(WIDE_VOCAB, 8),
                             keras.layers.Bidirectional(keras.layers.LSTM(4)),
                             keras.layers.Dense(CLASSES)])


def group_norm(data=None):
    """Dense(16) -> ``GroupNormalization(groups=4)`` under the default dense model."""
    import keras

    return dense(extra=(keras.layers.Dense(16), keras.layers.GroupNormalization(groups=4)))


def einsum_dense(data=None):
    """``EinsumDense("ab,bc->ac", 16, relu)`` -> Dense(3)."""
    import keras

    return keras.Sequential([keras.Input((FEATURES,)),
                             keras.layers.EinsumDense("ab,bc->ac", output_shape=16,
                                                      bias_axes="c", activation="relu"),
                             keras.layers.Dense(CLASSES)])
