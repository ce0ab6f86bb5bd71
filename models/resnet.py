"""A small ResNet-style CNN for [C, H, W] inputs:

    conv3x3(16) GN ReLU -> residual block(16) -> residual block(32, stride 2, 1x1 projection)
    -> global average pool -> linear(classes)

GroupNorm instead of BatchNorm: it has no running statistics, so every rank holds identical
state after each allreduce step (Horovod does not average BatchNorm buffers).
"""

WIDTHS = (16, 32)
GROUPS = 4
EPS = 1e-5


def build_torch(shape, classes):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.norm1 = nn.GroupNorm(GROUPS, cout, eps=EPS)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.norm2 = nn.GroupNorm(GROUPS, cout, eps=EPS)
            self.project = None
            if stride != 1 or cin != cout:
                self.project = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                             nn.GroupNorm(GROUPS, cout, eps=EPS))

        def forward(self, x):
            y = torch.relu(self.norm1(self.conv1(x)))
            y = self.norm2(self.conv2(y))
            return torch.relu(y + (self.project(x) if self.project is not None else x))

    channels = shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, WIDTHS[0], 3, 1, 1, bias=False), nn.GroupNorm(GROUPS, WIDTHS[0], eps=EPS),
        nn.ReLU(),
        Block(WIDTHS[0], WIDTHS[0], 1), Block(WIDTHS[0], WIDTHS[1], 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(WIDTHS[1], classes))


def build_tensorflow(shape, classes):
    import keras
    from keras import layers

    def norm():
        return layers.GroupNormalization(GROUPS, epsilon=EPS)

    def block(x, cout, stride):
        y = layers.Conv2D(cout, 3, stride, padding="same", use_bias=False)(x)
        y = layers.ReLU()(norm()(y))
        y = norm()(layers.Conv2D(cout, 3, 1, padding="same", use_bias=False)(y))
        if stride != 1 or x.shape[-1] != cout:
            x = norm()(layers.Conv2D(cout, 1, stride, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([y, x]))

    inputs = keras.Input(shape=shape)
    x = layers.Permute((2, 3, 1))(inputs)     # channels-first data, channels-last convs
    x = layers.ReLU()(norm()(layers.Conv2D(WIDTHS[0], 3, 1, padding="same", use_bias=False)(x)))
    x = block(x, WIDTHS[0], 1)
    x = block(x, WIDTHS[1], 2)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet")
