"""Typed client for the Parlance service."""
