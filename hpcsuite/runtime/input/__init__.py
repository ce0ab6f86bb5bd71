"""The input pipeline: datasets, sharding, block reads, loader workers, the device prefetch."""
