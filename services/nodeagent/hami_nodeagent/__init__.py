"""HAMi nodeagent service."""
