"""HAMi extender service."""
