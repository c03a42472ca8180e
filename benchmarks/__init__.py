"""Benchmarks: apportion beside dask.distributed and Ray (``python -m benchmarks.run``)."""
