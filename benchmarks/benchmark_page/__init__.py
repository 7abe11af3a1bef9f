"""The sections of docs/benchmarks.md (make_benchmark_page.py), each read from the raw results files."""
