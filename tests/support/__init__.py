"""Helpers shared by several test areas (not tests themselves)."""
