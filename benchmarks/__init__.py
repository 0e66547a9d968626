"""Benchmarks of redis-fifo-lock beside the Redis locks people would otherwise use.

One command runs every workload against every library on one Redis server and
writes a Markdown table, a JSON file and a PNG plot::

    uv run --all-extras --group bench python -m benchmarks.run --size full

``benchmarks/README.md`` defines every figure (headline: grants/s counting
every grant, and the idle gap from the previous holder's ``release`` call to
the next holder's ``acquire`` return); ``benchmarks/run.py`` lists the
workloads and options, ``benchmarks/analysis.py`` computes the contended
figures, and ``benchmarks/PROFILE.md`` says where a contended hand-off's time
goes.
"""
