"""Telemetry: the node monitor, TensorBoard and MLflow charts, the timeline, and the watches that end an attempt when another rank failed or a node lost its network."""
