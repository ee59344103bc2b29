"""HAMi metrics service."""
