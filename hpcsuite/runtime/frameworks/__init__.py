"""The framework backends: their protocols, the Horovod base, PyTorch's and TensorFlow's."""
