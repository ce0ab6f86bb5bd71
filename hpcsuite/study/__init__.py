"""Scaling studies: spec and points, the bundle, running the points, the report and the alpha-beta fit."""
