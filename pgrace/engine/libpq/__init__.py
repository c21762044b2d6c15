"""The libpq transport: a scenario's steps, each sent asynchronously on a session's raw libpq connection.

* :mod:`~pgrace.engine.libpq.runner`: :func:`run_scenario`, the connections, permutations, setup and checks;
* :mod:`~pgrace.engine.libpq.session`: one connection, its notices, results and loss;
* :mod:`~pgrace.engine.libpq.transport`: the scheduler's hooks for these sessions;
* :mod:`~pgrace.engine.libpq.waiting`: waiting in ``select`` on the sessions' sockets;
* :mod:`~pgrace.engine.libpq.own_steps`: a sleep, a crash, and a session the server ended.
"""
