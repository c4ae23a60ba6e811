"""Throwaway parts for tests/contracts/test_plugins.py: one module per axis, registered on import."""
