"""HAMi webhook service."""
