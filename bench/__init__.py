"""Benchmarks for the outbox relay on a real local stack (`make bench`, `python -m bench.run`).

`bench.run` measures the relay beside bare baselines and its peers on equal terms and prints the
goals; `bench.tail`, `bench.profile`, `bench.instructions`, `bench.ab` and `bench.encoding` are the
tools that explain a figure. BENCHMARKS.md says what each figure means and shows a run.
"""
