"""Benchmarks: apportion side by side with dask.distributed and Ray (``python -m benchmarks.run``)."""
