"""Helpers shared by the tests: real services started in temp dirs."""
