"""Orchestration: the loops and hooks that drive the test box between analysis steps."""
