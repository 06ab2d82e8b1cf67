"""The replay-simulation harness: benchmark bandits, paired-seed runs and regret reports."""
