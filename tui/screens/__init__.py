"""Screens pushed over the dashboard."""
