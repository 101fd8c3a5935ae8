"""Exactly-once aggregates: ``events`` counted into SQL tables (DESIGN.md boundary 5)."""
