"""rofu's command-line entry point; the packages it dispatches to are `service`, `replay`
and `benchmarks`."""
