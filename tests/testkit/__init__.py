"""Shared builders of the test suite (not test modules): raw runs, plans, the workflow and the
test box as the tests drive them. Test modules import these, never each other (a unit test,
``unit/test_test_layout.py``, checks)."""
