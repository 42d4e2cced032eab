"""Validation of predictions against real measurements in ../shared/data (see its README)."""
