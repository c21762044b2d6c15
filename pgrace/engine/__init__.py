"""The engine: one scheduler over two session transports, and pgrace's own SQL.

Shared by every transport:

* :mod:`~pgrace.engine.scheduler`: the one scheduler (launch, wait detection, the step-timeout
  cancel, completion and release, lock observation), written over
  :mod:`~pgrace.engine.session`'s protocol; :mod:`~pgrace.engine.completions` (a step's end);
* :mod:`~pgrace.engine.waiting`: the protocol of how a transport waits;
* :mod:`~pgrace.engine.steps`: the step book (launches, waits, cancels, ends, releases, locks),
  the only maker of step events;
* :mod:`~pgrace.engine.connections`: a run's connections (control, sessions, observer), opened at once;
* :mod:`~pgrace.engine.control`: setup, teardown and checks of every driver, bounded and cancellable;
* :mod:`~pgrace.engine.options`: how a run goes;
* :mod:`~pgrace.engine.sqlerrors` and :mod:`~pgrace.engine.results`: a server's error report
  and a result, as pgrace keeps them, converted once;
* :mod:`~pgrace.engine.observe`: what the server says the sessions hold and wait for.

One folder per transport:

* :mod:`~pgrace.engine.libpq`: scenario steps over libpq connections;
* :mod:`~pgrace.engine.threads`: the application's code, a thread per session.

The orders a run follows are :mod:`pgrace.model.orders`'.
"""
