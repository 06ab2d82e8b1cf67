"""The replay's simulation: bandits from benchmark data, the policies it compares, one paired
run."""
