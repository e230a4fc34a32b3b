"""The notebooks and their build (a package only so that pytest imports notebooks/conftest.py under its own name,
beside tests/conftest.py)."""
