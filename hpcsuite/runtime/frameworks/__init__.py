"""The framework backends: the protocols a backend and the ranks' collectives meet, the Horovod base both frameworks share, PyTorch's and TensorFlow's, and the framework state a checkpoint keeps."""
