"""``kerasdist bench``: strategies side by side against plain Keras, a raw step and tf_keras."""
