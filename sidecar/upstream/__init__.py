"""Upstream endpoints and how one is chosen for each attempt."""
