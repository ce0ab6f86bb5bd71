"""A small multi-layer perceptron: features -> 64 -> 64 -> classes, ReLU."""

HIDDEN = (64, 64)


def build_torch(features: int, classes: int):
    import torch.nn as nn

    layers, width = [], features
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def build_tensorflow(features: int, classes: int):
    import keras

    inputs = keras.Input(shape=(features,))
    x = inputs
    for h in HIDDEN:
        x = keras.layers.Dense(h, activation="relu")(x)
    outputs = keras.layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="mlp")
