"""Test support code (no tests): helpers, shared runs and scripts the tiers import as `support.<module>`.

`tests/` is on sys.path through `pythonpath = ["tests"]` in pyproject.toml's [tool.pytest.ini_options], so test
modules never import one another, nor a conftest.py."""
