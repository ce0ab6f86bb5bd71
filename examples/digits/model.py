"""The model of the digits example, for both frameworks: 64 pixels -> 128 -> 64 -> 10 classes.

hpcsuite calls the builder named in the spec with the shape of one input and the number of
classes, and trains what it returns (a torch.nn.Module, or a keras.Model for TensorFlow).
Frameworks are imported inside the builders: `hpcsuite lint` reads this file without running it.
"""

import math

HIDDEN = (128, 64)
DROPOUT = 0.1


def build(input_shape, classes):
    """PyTorch."""
    import torch.nn as nn

    layers, width = [nn.Flatten()], math.prod(input_shape)
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(DROPOUT)]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def build_keras(input_shape, classes):
    """TensorFlow / Keras 3."""
    import keras

    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    for h in HIDDEN:
        x = keras.layers.Dense(h, activation="relu")(x)
        x = keras.layers.Dropout(DROPOUT)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)     # logits
    return keras.Model(inputs, outputs, name="digits")
