"""The I/O shell of rofu: settings, the HTTP service, persistence, the trainer and the CLI."""
