"""The conformance cases: one ordinary Keras 3 feature each, run under every strategy.

A :class:`Case` names the feature, its data, a model builder, how it is compiled and fitted, and
its oracle (:mod:`kerasdist.conformance.oracle`). :data:`CASES` is the whole matrix's row list, in
the order the rows of ``docs/conformance.md`` appear.

Each case trains :data:`~kerasdist.conformance.data.EPOCHS` epochs of
:data:`~kerasdist.conformance.data.STEPS_PER_EPOCH` steps on global batches of
:data:`~kerasdist.conformance.data.GLOBAL_BATCH`, then evaluates and predicts.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

from kerasdist.conformance import models, saving
from kerasdist.conformance.callback_cases import callback_cases, one_callback
from kerasdist.conformance.case import SCCE, Case, _optimizer, sgd_compile
from kerasdist.conformance.data import WIDE_VOCAB


def _opt_case(name: str, feature: str, factory: Callable) -> Case:
    return Case(name, feature, compile=lambda: sgd_compile(optimizer=factory()))


def _confusion_metrics():
    import keras

    return [keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
            keras.metrics.PrecisionAtRecall(0.5, name="precision_at_recall"),
            keras.metrics.BinaryAccuracy(name="binary_accuracy")]


def _f1_metrics():
    import keras

    return [keras.metrics.F1Score(average="macro", threshold=0.5, name="f1")]


def _lr_schedule():
    import keras

    return _optimizer(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))


def _loss_scale():
    import keras

    return keras.optimizers.LossScaleOptimizer(_optimizer(), initial_scale=2.0 ** 8)


def _sum_loss():
    import keras

    return sgd_compile(optimizer=_optimizer(learning_rate=0.005),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                       reduction="sum"))


def _weighted_mean_loss():
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                      reduction="mean_with_sample_weight")
    return sgd_compile(loss=loss, steps_per_execution=2)


# (case suffix, shown name, keras.optimizers class name, keyword arguments)
SPARSE_OPTIMIZERS = (
    ("adam", "Adam", "Adam", {}),
    ("adamw", "AdamW", "AdamW", {"weight_decay": 0.05}),
    ("adamax", "Adamax", "Adamax", {}),
    ("nadam", "Nadam", "Nadam", {}),
    ("rmsprop", "RMSprop", "RMSprop", {}),
    ("adagrad", "Adagrad", "Adagrad", {}),
    ("adadelta", "Adadelta", "Adadelta", {"learning_rate": 1.0}),
    ("ftrl", "Ftrl", "Ftrl", {}),
    ("lion", "Lion", "Lion", {"learning_rate": 0.001}),
    ("adafactor", "Adafactor", "Adafactor", {}),
    ("sgd_momentum", "SGD(momentum=0.9)", "SGD", {"momentum": 0.9}),
)


def _sparse_case(suffix: str, shown: str, class_name: str, kwargs: dict) -> Case:
    return Case(f"sparse_{suffix}", f"sparse gradients: Embedding(200, 8) + {shown}",
                data="wide_tokens",
                model=lambda data: models.sequence(data, vocab=WIDE_VOCAB),
                compile=lambda: sgd_compile(optimizer=_optimizer(class_name, **kwargs)))


def _loss_compile(loss_name: str, **kwargs):
    import keras

    return sgd_compile(loss=getattr(keras.losses, loss_name)(**kwargs), metrics=())


CASES: tuple[Case, ...] = (
    # -- models
    Case("sequential", "Sequential (Dense)"),
    Case("functional_multi_io", "Functional, 2 inputs / 2 outputs, loss_weights",
         data="multi", model=models.functional_multi_io,
         compile=lambda: sgd_compile(loss={"cls": SCCE, "reg": "mse"},
                                     loss_weights={"cls": 1.0, "reg": 0.5},
                                     metrics={"cls": ["accuracy"], "reg": ["mae"]})),
    Case("subclassed", "Subclassed keras.Model", model=models.subclassed),
    Case("custom_train_test_step", "custom train_step / test_step (guide's pattern)",
         model=models.custom_step),
    Case("custom_compute_loss", "custom compute_loss", model=models.custom_compute_loss),
    # -- layers
    Case("batchnorm", "BatchNormalization", model=models.batchnorm,
         per_replica="each replica normalizes with its own batch statistics (Keras's "
                     "synchronized=False semantics); moving statistics are averaged over "
                     "replicas"),
    Case("batchnorm_synchronized", "BatchNormalization(synchronized=True)",
         model=lambda data: models.batchnorm(data, synchronized=True)),
    Case("dropout", "Dropout", model=models.dropout,
         per_replica="each replica draws its own dropout mask for its part of the batch"),
    Case("layernorm", "LayerNormalization", model=models.layernorm),
    Case("embedding", "Embedding", data="tokens", model=models.sequence),
    Case("lstm", "LSTM", data="tokens", model=lambda data: models.sequence(data, rnn="lstm")),
    Case("gru", "GRU", data="tokens", model=lambda data: models.sequence(data, rnn="gru")),
    # -- preprocessing
    Case("normalization", "Normalization (adapted) in the model", model=models.normalization),
    Case("string_lookup", "StringLookup (adapted) in the model", data="words",
         model=models.string_lookup),
    Case("integer_lookup", "IntegerLookup (adapted) in the model", data="ints",
         model=models.integer_lookup),
    Case("text_vectorization", "TextVectorization (adapted) in the model", data="strings",
         model=models.text_vectorization),
    Case("lookup_in_pipeline", "TextVectorization (multi-hot lookup) in the tf.data pipeline",
         data="strings", pipeline=models.multi_hot_pipeline, model=lambda data: models.dense()),
    Case("normalization_in_pipeline", "Normalization in the tf.data pipeline",
         pipeline=models.normalization_pipeline, model=lambda data: models.dense()),
    # -- metrics and weights
    Case("metrics_mean", "mean metrics (accuracy, crossentropy, top-k)",
         compile=lambda: sgd_compile(metrics=("accuracy", "sparse_top_k_categorical_accuracy"))),
    Case("metrics_confusion", "AUC, Precision, Recall, PrecisionAtRecall", data="binary",
         model=lambda data: models.dense(out=1, activation="sigmoid"),
         compile=lambda: sgd_compile(loss="binary_crossentropy",
                                     metrics=_confusion_metrics())),
    Case("metrics_confusion_uneven", "AUC, Precision, Recall on 60 examples (partial last "
         "batch, uneven shards)", data="binary", eval_examples=60, drop_remainder=False,
         model=lambda data: models.dense(out=1, activation="sigmoid"),
         compile=lambda: sgd_compile(loss="binary_crossentropy",
                                     metrics=_confusion_metrics())),
    Case("metrics_f1", "F1Score", data="binary",
         model=lambda data: models.dense(out=1, activation="sigmoid"),
         compile=lambda: sgd_compile(loss="binary_crossentropy", metrics=_f1_metrics())),
    Case("metrics_custom", "custom keras.metrics.Metric subclass", data="regression",
         model=lambda data: models.dense(out=1),
         compile=lambda: sgd_compile(loss="mse", metrics=[models.custom_metric()])),
    Case("sample_weight", "sample_weight", weighted=True),
    Case("class_weight", "class_weight", fit_kwargs={"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}}),
    # -- optimizers
    _opt_case("sgd_momentum_nesterov", "SGD momentum + nesterov",
              partial(_optimizer, momentum=0.9, nesterov=True)),
    _opt_case("adam", "Adam", partial(_optimizer, "adam")),
    _opt_case("adamw", "AdamW", partial(_optimizer, "adamw", weight_decay=0.05)),
    _opt_case("clipnorm", "clipnorm", partial(_optimizer, clipnorm=0.1)),
    _opt_case("clipvalue", "clipvalue", partial(_optimizer, clipvalue=0.01)),
    _opt_case("global_clipnorm", "global_clipnorm", partial(_optimizer, global_clipnorm=0.1)),
    _opt_case("use_ema", "use_ema", partial(_optimizer, "adam", use_ema=True,
                                        ema_overwrite_frequency=3)),
    _opt_case("gradient_accumulation", "gradient_accumulation_steps=2",
              partial(_optimizer, momentum=0.9, gradient_accumulation_steps=2)),
    _opt_case("loss_scale_optimizer", "LossScaleOptimizer", _loss_scale),
    _opt_case("lr_schedule", "learning-rate schedule (ExponentialDecay)", _lr_schedule),
    *callback_cases(),
    # -- inputs
    Case("input_numpy", "fit/evaluate/predict from NumPy", input="numpy"),
    Case("input_dataset_fn", "fit/evaluate/predict from a dataset_fn", input="dataset_fn"),
    Case("input_full_epochs", "1,000 examples, seeded shuffle, full epochs with a partial last "
         "batch (63 steps an epoch)", examples=1000, steps_per_epoch=None,
         drop_remainder=False),
    Case("input_unshuffled", "unshuffled dataset, drop_remainder, repeat() + steps_per_epoch",
         shuffle_seed=None, drop_remainder=True),
    Case("metrics_outside_scope", "AUC/Precision/Recall built outside the scope, 2,048 "
         "shuffled examples, repeat() + steps_per_epoch", data="binary",
         compile=lambda: sgd_compile(metrics=_confusion_metrics(), loss="binary_crossentropy"),
         model=lambda data: models.dense(out=1, activation="sigmoid"), examples=2048,
         drop_remainder=True, steps_per_epoch=16, metrics_outside_scope=True),
    Case("steps_per_execution", "compile(steps_per_execution=4), 1,000 examples, full epochs "
         "(a partial last group)", examples=1000, steps_per_epoch=None,
         compile=lambda: sgd_compile(steps_per_execution=4)),
    Case("loss_sum", "loss reduction=\"sum\", 200 examples, full epochs (a partial last "
         "batch)", examples=200, steps_per_epoch=None, drop_remainder=False,
         compile=_sum_loss),
    Case("loss_weighted_mean", "loss reduction=\"mean_with_sample_weight\" with uneven "
         "sample weights, steps_per_execution=2, 200 examples, full epochs (a partial last "
         "batch)", weighted=True, examples=200, steps_per_epoch=None, drop_remainder=False,
         compile=_weighted_mean_loss),
    # -- losses added by layers and regularizers, a frozen sub-model, masking, attention,
    # augmentation layers, a PyDataset input and a KerasHub backbone
    Case("add_loss", "add_loss in a layer's call", model=models.add_loss_layer),
    Case("kernel_regularizer", "kernel_regularizer (L2)",
         model=lambda data: models.add_loss_regularized(data, penalty=False)),
    Case("activity_regularizer", "activity_regularizer (L1)",
         model=lambda data: models.add_loss_regularized(data, activity=True),
         per_replica="Keras 3 adds an activity regularizer's penalty summed over the "
                     "examples a replica sees (not divided by the batch size), so each "
                     "replica adds the sum over its part of the batch"),
    Case("frozen_submodel_batchnorm", "frozen sub-model with BatchNormalization",
         model=models.frozen_submodel),
    Case("masking_lstm", "masking (Embedding mask_zero=True + LSTM)", data="padded",
         model=models.masked_lstm),
    Case("multi_head_attention", "MultiHeadAttention", data="tokens", model=models.attention),
    Case("augmentation", "data augmentation layers (RandomFlip, RandomTranslation)",
         data="images", model=models.augmented,
         per_replica="each replica draws its own random flips and shifts for its part of the "
                     "batch"),
    Case("pydataset", "fit from a keras.utils.PyDataset (640 examples, reshuffled each "
         "epoch, full epochs)", input="pydataset", examples=640, steps_per_epoch=None),
    Case("kerashub_bert", "KerasHub BertBackbone (from its config, untrained)", data="bert",
         model=models.kerashub_bert),
    # -- saving
    Case("save_keras_load", "model.save (.keras) + load_model", after=saving.save_keras,
         check=saving.check_keras),
    Case("export", "model.export (SavedModel)", after=saving.export,
         check=saving.check_export),
    Case("save_every_worker", "model.save + save_weights called by every worker on one path",
         after=saving.save_every_worker, check=saving.check_every_worker),
    Case("mixed_bfloat16", "mixed_bfloat16 policy", precision="mixed_bfloat16",
         tolerance=(2e-2, 2e-2)),
    # -- sparse gradients under every Keras optimizer that takes them: Embedding(200, 8) on token
    # ids drawn from 200 ("wide_tokens"): a global batch of 16 x 6 ids touches at most 96 of the
    # rows, so the IndexedSlices path (untouched rows, duplicate ids, the mean over replicas)
    # decides the weights and optimizer state, compared with the strategy-free run
    *(_sparse_case(*spec) for spec in SPARSE_OPTIMIZERS),
    # -- each task saving and checkpointing to its own folder
    Case("save_own_path", "model.save + save_weights + export, each task to its own folder",
         after=saving.save_own_path, check=saving.check_own_path),
    Case("cb_checkpoint_own_path", "ModelCheckpoint + BackupAndRestore, each task to its "
         "own folder", callbacks=saving.checkpoint_own, check=saving.check_checkpoint_own),
    # -- XLA, further layers, losses, the Lamb optimizer and the SwapEMAWeights callback
    Case("jit_compile", "compile(jit_compile=True) (XLA)",
         compile=lambda: sgd_compile(jit_compile=True)),
    Case("conv_pooling", "Conv2D + MaxPooling2D + GlobalMaxPooling2D", data="images",
         model=models.conv_pooling),
    Case("bidirectional_adam", "Bidirectional(LSTM) over Embedding(200, 8) + Adam",
         data="wide_tokens", model=models.bidirectional,
         compile=lambda: sgd_compile(optimizer=_optimizer("Adam"))),
    Case("group_normalization", "GroupNormalization", model=models.group_norm),
    Case("einsum_dense", "EinsumDense", model=models.einsum_dense),
    Case("huber_loss", "Huber loss (regression)", data="regression",
         model=lambda data: models.dense(out=1),
         compile=lambda: _loss_compile("Huber", delta=0.5)),
    Case("binary_focal_loss", "BinaryFocalCrossentropy", data="binary",
         model=lambda data: models.dense(out=1, activation="sigmoid"),
         compile=lambda: _loss_compile("BinaryFocalCrossentropy", gamma=2.0)),
    Case("lamb", "Lamb optimizer",
         compile=lambda: sgd_compile(optimizer=_optimizer("Lamb"))),
    Case("cb_swap_ema_weights", "SwapEMAWeights callback (Adam use_ema)",
         callbacks=one_callback("SwapEMAWeights", swap_on_epoch=True),
         compile=lambda: sgd_compile(optimizer=_optimizer("Adam", use_ema=True))),
)
"""Every case, in matrix order (:func:`all_cases` sets their ``drop_remainder``)."""


def all_cases() -> list[Case]:
    """Every case, in matrix order."""
    # drop_remainder both ways: every other case, unless the case says
    cases = [c if c.drop_remainder is not None else dataclasses.replace(c, drop_remainder=i % 2 == 0)
             for i, c in enumerate(CASES)]
    names = [c.name for c in cases]
    if len(names) != len(set(names)):
        raise RuntimeError(f"duplicate conformance case names: {names}")
    return cases


def select(names=None) -> list[Case]:
    """The cases named (all when ``names`` is empty), in matrix order.

    Raises:
        ValueError: an unknown case name (the message lists the known ones).
    """
    cases = all_cases()
    if not names:
        return cases
    known = {c.name: c for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown conformance case(s) {unknown}. Known: {sorted(known)}")
    return [c for c in cases if c.name in set(names)]


def compile_model(model, case: Case, *, metrics=None) -> Any:
    """Compile ``model`` with the case's arguments (``jit_compile=False`` unless the case asks:
    the same kernels on every strategy); ``metrics``, when given, replaces the case's (objects
    built elsewhere). Returns the model."""
    import keras

    kwargs = case.compile()
    if metrics is not None:
        kwargs["metrics"] = metrics
    loss = kwargs.get("loss")
    if loss == SCCE:
        kwargs["loss"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    elif isinstance(loss, dict):
        kwargs["loss"] = {k: keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                          if v == SCCE else v for k, v in loss.items()}
    kwargs.setdefault("jit_compile", False)
    model.compile(**kwargs)
    return model
