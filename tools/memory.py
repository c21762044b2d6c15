"""How much memory a process took at its peak, measured from inside it.

``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in a parent is no measure of a child: a forked
child starts as a copy of its parent, so a parent of 159 MiB reads a child of at least
159 MiB. ``VmHWM`` in the child's own ``/proc/self/status`` is the child's own peak.
"""

from __future__ import annotations

__all__ = ["peak_mib"]


def peak_mib() -> float:
    """This process's peak resident set size (``VmHWM``), in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
