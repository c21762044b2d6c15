"""The engine: one scheduler over two session transports, and pgrace's own SQL.

* :mod:`~pgrace.engine.scheduler`: the one scheduler (launch, wait detection, the step-timeout
  cancel, completion and release, lock observation), written over
  :mod:`~pgrace.engine.session`'s protocol; :mod:`~pgrace.engine.completions` (a step's end);
* :mod:`~pgrace.engine.waiting`: how it waits, per transport: on libpq sockets, or on the
  gates of the application's threads;
* :mod:`~pgrace.engine.steps`: the step book (launches, waits, cancels, ends, releases, locks),
  the only maker of step events;
* scenario steps over libpq: :mod:`~pgrace.engine.runner` (connections, permutations, setup,
  checks), :mod:`~pgrace.engine.pauses` (sleep, crash, ended sessions),
  :mod:`~pgrace.engine.libpq` (one connection);
* the application's code over threads: :mod:`~pgrace.engine.code_runner`,
  :mod:`~pgrace.engine.code_scheduler` (which statement goes next), :mod:`~pgrace.engine.threads`;
* :mod:`~pgrace.engine.control`: setup, teardown and checks of every driver, bounded and cancellable;
* :mod:`~pgrace.engine.sqlerrors` and :mod:`~pgrace.engine.results`: a server's error report
  and a result, as pgrace keeps them, converted once;
* :mod:`~pgrace.engine.schedule`: the orders a run follows (fixed, enumerated, discovered).
"""
