"""The engine: one scheduler's bookkeeping over two session transports, and pgrace's own SQL.

* :mod:`~pgrace.engine.steps`: the step book (launches, waits, cancels, ends, releases, locks);
* :mod:`~pgrace.engine.session`: what the book needs of a session;
* :mod:`~pgrace.engine.libpq` and :mod:`~pgrace.engine.scheduler`: scenario steps over libpq;
* :mod:`~pgrace.engine.threads` and :mod:`~pgrace.engine.code_scheduler`: the application's code;
* :mod:`~pgrace.engine.control`: setup, teardown and checks, bounded and cancellable;
* :mod:`~pgrace.engine.sqlerrors`: a server's error report as a SqlError, once;
* :mod:`~pgrace.engine.schedule`: the orders a run follows (fixed, enumerated, discovered).
"""
