"""Shared core of the HAMi services."""
