"""Benchmarks of redis-fifo-lock beside the Redis locks people would otherwise use.

One command runs every workload against every library on one Redis server and
writes a Markdown table, a JSON file and a PNG plot::

    uv run --all-extras --group bench python -m benchmarks.run --size full

See ``benchmarks/run.py`` for the workloads and the options, and
``benchmarks/analysis.py`` for how each figure is computed.
"""
