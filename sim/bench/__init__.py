"""The benchmarks of ``make bench`` and ``make resources``: each module prints its tables."""
