"""A user's model for bench/train_overhead.py --user: an MLP defined outside hpcsuite, as a
user would write it (the same layers as the built-in mlp, so the numbers compare)."""

import math

HIDDEN = (64, 64)


def build(input_shape, classes):
    import torch.nn as nn

    layers, width = [nn.Flatten()], math.prod(input_shape)
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def build_keras(input_shape, classes):
    import keras

    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    for h in HIDDEN:
        x = keras.layers.Dense(h, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def build_cnn(input_shape, classes):
    """A small convolutional network for [C, H, W] inputs: two conv blocks and a classifier."""
    import torch.nn as nn

    channels, height, width = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (height // 4) * (width // 4), 128), nn.ReLU(),
        nn.Linear(128, classes))


def build_cnn_keras(input_shape, classes):
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    x = layers.Permute((2, 3, 1))(inputs)          # channels-first data, channels-last convs
    x = layers.MaxPooling2D(2)(layers.Conv2D(32, 3, padding="same", activation="relu")(x))
    x = layers.MaxPooling2D(2)(layers.Conv2D(64, 3, padding="same", activation="relu")(x))
    x = layers.Dense(128, activation="relu")(layers.Flatten()(x))
    return keras.Model(inputs, layers.Dense(classes)(x))
