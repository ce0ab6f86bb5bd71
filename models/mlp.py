"""A small multi-layer perceptron: flatten -> 64 -> 64 -> classes, ReLU."""

import math

HIDDEN = (64, 64)


def build_torch(shape, classes):
    import torch.nn as nn

    layers, width = [nn.Flatten()], math.prod(shape)
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def build_tensorflow(shape, classes):
    import keras

    inputs = keras.Input(shape=shape)
    x = keras.layers.Flatten()(inputs)
    for h in HIDDEN:
        x = keras.layers.Dense(h, activation="relu")(x)
    # float32 logits even under mixed_float16, as Keras recommends for the last layer.
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")
