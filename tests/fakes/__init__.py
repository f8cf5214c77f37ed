"""Fake provider APIs that replay documented wire formats, for tests."""
