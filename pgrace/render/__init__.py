"""Renderers: turn a recorded Run into text."""
