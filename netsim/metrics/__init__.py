"""Interpreters of a run's events and metrics: counts, tables, plots."""
