"""The thread transport: the application's own code, a thread per session, parked at each statement.

* :mod:`~pgrace.engine.threads.runner`: :class:`CodeRunner`, one set of connections run as often as asked;
* :mod:`~pgrace.engine.threads.order`: which parked session's statement goes next;
* :mod:`~pgrace.engine.threads.session`: the traced connection and the session's gate;
* :mod:`~pgrace.engine.threads.waiting`: waiting on the condition the sessions' threads notify;
* :mod:`~pgrace.engine.threads.frames`: the application's line of a statement.
"""
