"""Persistence: SQLAlchemy tables, engines and the repository of domain operations."""
