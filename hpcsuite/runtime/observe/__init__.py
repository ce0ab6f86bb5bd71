"""Telemetry: monitor, TensorBoard and MLflow charts, timeline, failure and network watches."""
