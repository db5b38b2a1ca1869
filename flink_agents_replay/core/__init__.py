"""The bottom layer: the package's errors, its events, Flink's key groups in Python, the cache directory, and
where each module of 0.5.1 lives now."""
