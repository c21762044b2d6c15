"""The terminal's own UI: the presenter and its screen, live playback, the progress line, check's stream.

Unlike :mod:`pgrace.render`, whose functions turn a result into text, these hold a terminal:
they draw as a run goes, read keys and redraw lines in place.
"""
