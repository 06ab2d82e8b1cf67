"""The decision log: its records read in pages, and its exports (DSJSON, OBP, Parquet)."""
