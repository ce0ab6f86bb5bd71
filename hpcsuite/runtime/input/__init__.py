"""The input pipeline: datasets, which samples each rank reads (sharding), block reads, loader workers and the device prefetch."""
