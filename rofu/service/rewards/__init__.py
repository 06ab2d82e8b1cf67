"""Rewards: storing them durably, deferred activation, and the business metrics they feed."""
