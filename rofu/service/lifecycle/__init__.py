"""The model's lifecycle: the trainer, checkpoints stored and published, followed and pinned."""
