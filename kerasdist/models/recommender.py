"""A click-through model for parameter-server training of large embedding tables.

The model of ``recipes/embedding_ps.yaml``: a user and an item embedding table, their rows
concatenated, a small dense head and one sigmoid output, the shape of the recommender models
that parameter servers exist for (a table too large for one task, split over the ps tasks by
``strategy.variable_partitioning``).
"""

from __future__ import annotations


def click_model(*, num_users: int = 4_096, num_items: int = 1_048_576, dim: int = 32,
                hidden: int = 64):
    """User x item click model.

    Args:
        num_users: rows of the user table (user ids are in ``[0, num_users)``).
        num_items: rows of the item table (item ids in ``[0, num_items)``); with ``dim`` 32 and
            float32, 1,048,576 rows are 128 MiB, 384 MiB with Adam's two slots.
        dim: embedding width.
        hidden: units of the dense layer.

    Returns:
        An uncompiled functional ``keras.Model``: input ``(batch, 2)`` int64 ``[user, item]``,
        output ``(batch, 1)`` float32, the click probability. Its tables are the layers named
        ``user_embedding`` and ``item_embedding``.
    """
    import keras

    ids = keras.Input(shape=(2,), dtype="int64", name="user_item")
    users = keras.layers.Embedding(num_users, dim, name="user_embedding")(ids[:, 0])
    items = keras.layers.Embedding(num_items, dim, name="item_embedding")(ids[:, 1])
    both = keras.layers.Concatenate()([users, items])
    hidden_out = keras.layers.Dense(hidden, activation="relu")(both)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(hidden_out)
    return keras.Model(ids, click, name="click_model")
