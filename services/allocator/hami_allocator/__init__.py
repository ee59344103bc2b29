"""HAMi allocator service."""
