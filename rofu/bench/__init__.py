"""Benchmark commands: contenders timed side by side in one run, reported as ratios."""
