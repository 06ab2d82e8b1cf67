"""Deciding: a /select request validated, batched, scored with ROFU from the served snapshot."""
