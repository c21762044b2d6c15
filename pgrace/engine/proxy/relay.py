"""The proxy's sockets: a listener on 127.0.0.1, one thread per client connection, the step loop.

Every byte goes through untouched; the relay only decides *when* a step's bytes go upstream. It
groups the client's messages into steps (:mod:`pgrace.engine.proxy.steps`), asks
:meth:`Hooks.ready` before each one goes (the scheduler may hold it there), forwards the server's
answer as it comes (an ErrorResponse reaches the client at once) and tells :meth:`Hooks.done`
when the step is complete. It never fabricates a Sync or a ReadyForQuery. Steps the client sent
ahead (a pipeline) wait in order behind the running one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import selectors
import socket
import threading
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from pgrace.engine.proxy import startup, wire
from pgrace.engine.proxy.peers import KernelSilent, in_transit, peer_pid, tcp_end
from pgrace.engine.proxy.steps import GroupedStep, Grouper, Memory, Reply, Statement, Tracker, is_copy

__all__ = ["Client", "Hooks", "Proxy", "Refused", "Reply", "Statement"]

#: Server bytes waiting for a slow client before the relay stops reading the server (backpressure, not an error).
MAX_WAITING_OUTPUT = 1024 * 1024
#: How long the relay waits for a client to take its last bytes (an ErrorResponse) before closing anyway.
LAST_WORDS_TIMEOUT_S = 5.0


@dataclass
class Client:
    """One client connection, after its start-up."""

    number: int
    """1, 2, ... in the order the proxy's clients finished their start-up."""
    application_name: str | None
    backend_pid: int
    """The server backend's pid, from BackendKeyData: how the observer finds its waits."""
    peer_pid: int | None
    """The client's OS process when it can be found (SO_PEERCRED, or the owner of its TCP port)."""


class Refused(Exception):
    """Raised by :meth:`Hooks.ready` to turn a statement away: the client gets it as an ErrorResponse, then EOF."""

    def __init__(self, message: str, sqlstate: str = "57P01") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Hooks(Protocol):
    """What the relay tells the session transport, from the relay's threads (one per client connection)."""

    def opened(self, client: Client) -> None:
        """A client finished its start-up; called before it gets its first ReadyForQuery."""

    def ready(self, client: Client, statement: Statement) -> None:
        """Block the relay thread until the statement may go upstream (or raise :class:`Refused`).

        A hook that holds a statement must return once ``Proxy.closing`` is set.
        """

    def done(self, client: Client, statement: Statement, reply: Reply) -> None:
        """The statement's answer is complete (the client has the bytes, or is getting them)."""

    def closed(self, client: Client, why: str | None) -> None:
        """The connection ended: ``why`` is None when the client ended it, else what ended it."""


class Proxy:
    """Listens on 127.0.0.1 at a free port and relays each client to ``upstream_host:upstream_port``.

    ``upstream_host`` may be a unix socket directory (a path, as in libpq). With ``socket_dir``
    the proxy also listens on a unix socket there, at the same port number (``host=DIR`` for libpq):
    a client on it is known by its process id for sure (SO_PEERCRED). Leaving the ``with``
    block closes every connection, cancelling a statement still running upstream, and joins
    every thread: nothing the proxy opened is left on the server.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        hooks: Hooks,
        *,
        max_message: int = wire.DEFAULT_MAX_MESSAGE,
        socket_dir: str | None = None,
    ) -> None:
        self.upstream = startup.Upstream(upstream_host, upstream_port)
        self.hooks = hooks
        self.max_message = max_message
        self.host = "127.0.0.1"
        self.port = 0
        self.closing = threading.Event()
        """Set when the proxy closes: a hook holding a statement must let go."""
        self._cancels = startup.CancelKeys(self.upstream)
        self.socket_dir = socket_dir
        self._listeners: list[socket.socket] = []
        self._wake_accept: tuple[socket.socket, socket.socket] | None = None
        self._threads: list[threading.Thread] = []
        self._relays: set[_Relay] = set()
        self._lock = threading.Lock()
        self._accepting = 0
        self._accepts = 0
        """How many accepts have begun: read before and after a look at the backlog, it says none began between."""
        self._numbers = itertools.count(1)
        self._serials = itertools.count(1)

    @property
    def dsn(self) -> str:
        """A conninfo fragment for a client: the proxy's host and port (add dbname, user)."""
        return f"host={self.host} port={self.port} sslmode=disable"

    def __enter__(self) -> Proxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listeners.append(listener)
        if self.socket_dir is not None:
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listeners.append(local)
            local.bind(self.socket_path)
            local.listen(128)
        self._wake_accept = socket.socketpair()
        accept = threading.Thread(target=self._accept, name=f"pgrace-proxy:{self.port}", daemon=True)
        self._threads.append(accept)
        accept.start()
        return self

    @property
    def socket_path(self) -> str:
        """The unix socket a libpq client reaches with ``host=socket_dir port=port``."""
        return f"{self.socket_dir}/.s.PGSQL.{self.port}"

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection and join every thread."""
        self.closing.set()
        if self._wake_accept is not None:
            with contextlib.suppress(OSError):
                self._wake_accept[1].send(b"x")
        if self._threads:
            self._threads[0].join()  # the accept thread: no relay is added after it ends
        with self._lock:
            relays, threads = list(self._relays), list(self._threads)
        for relay in relays:
            relay.wake()
        for thread in threads:
            thread.join()
        for sock in (*self._listeners, *(self._wake_accept or ())):
            sock.close()
        if self.socket_dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)

    def _accept(self) -> None:
        assert self._wake_accept is not None
        with selectors.DefaultSelector() as selector:
            for listener in self._listeners:
                selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_accept[0], selectors.EVENT_READ)
            while not self.closing.is_set():
                for key, _ in selector.select():
                    ready = key.fileobj
                    if not isinstance(ready, socket.socket) or ready not in self._listeners:
                        continue
                    if self.closing.is_set():
                        break
                    with self._lock:
                        self._accepting += 1  # counted as starting from the backlog to its relay
                        self._accepts += 1
                    try:
                        sock, _ = ready.accept()
                        if sock.family == socket.AF_INET:
                            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._start(_Relay(self, sock))
                    except OSError:
                        continue
                    finally:
                        with self._lock:
                            self._accepting -= 1

    def _start(self, relay: _Relay) -> None:
        thread = threading.Thread(target=relay.run, name=f"pgrace-proxy-client:{self.port}", daemon=True)
        with self._lock:
            self._threads = [self._threads[0], *(t for t in self._threads[1:] if t.is_alive())]
            self._relays.add(relay)
            self._threads.append(thread)
        thread.start()

    def in_between(self) -> str | None:
        """What the proxy is in the middle of, for people: a connection not yet a session, or bytes on
        their way; None when nothing is.

        A client in its start-up (waiting to be accepted, or accepted and not yet answered) waits
        for the proxy, asleep, and its backend may be on the server with its pid not yet known: it
        will send a statement once it has its ReadyForQuery, so until then nobody can tell which
        sessions are ready. Read from the proxy's own relays and accepts, around a look at the
        listeners' backlog: a connection that arrives meanwhile is either still in the backlog or
        being accepted. Bytes sent and not yet read are in the kernel's queues of either end.
        """
        if self.closing.is_set():
            return None
        with self._lock:
            relays = list(self._relays)
            accepting, accepts = self._accepting, self._accepts
        if accepting > 0 or any(not relay.started_up for relay in relays):
            return "a client connection's start-up at the proxy"
        if select.select(self._listeners, [], [], 0)[0]:
            return "a client connection the proxy has not accepted yet"
        with self._lock:
            if self._accepts != accepts:
                return "a client connection the proxy has not accepted yet"
        if self._in_transit(relays):
            return "bytes on their way between a client and the proxy"
        return None

    def _in_transit(self, relays: list[_Relay]) -> bool:
        """Whether bytes wait in the kernel's queues at either end of a relay's TCP connection."""
        try:
            for relay in relays:
                if relay.ends is not None and any(
                    end is not None and end.queued for end in (tcp_end(*relay.ends), tcp_end(*relay.ends[::-1]))
                ):
                    return True
        except KernelSilent:
            return in_transit(self.port)
        return False

    def client_sockets(self) -> set[int] | None:
        """The inodes of the clients' ends of the proxy's TCP connections; None when the kernel cannot say."""
        with self._lock:
            relays = [relay for relay in self._relays if relay.ends is not None]
        if any(relay.client_inode is None for relay in relays):
            return None
        return {relay.client_inode for relay in relays if relay.client_inode}

    def answered(self) -> tuple[tuple[int, int], ...] | None:
        """How often each connection's relay has answered its client (sent it bytes, or closed it); None while
        one is doing so.

        A client asleep waiting for the proxy wakes only when the proxy answers it. Read before and
        after a look at the clients' processes, the same value says that none of them was woken
        in between: the look holds for the whole of it.
        """
        with self._lock:
            relays = list(self._relays)
        marks = []
        for relay in relays:
            answers = relay.answers
            if answers & 1:
                return None
            marks.append((relay.serial, answers))
        return tuple(sorted(marks))

    def _number(self) -> int:
        with self._lock:
            return next(self._numbers)

    def _forget(self, relay: _Relay) -> None:
        with self._lock:
            self._relays.discard(relay)


def _interest(out: bytearray, *, reading: bool) -> int:
    """The epoll events a socket waits for: input while it is read, output while bytes wait for it."""
    return (select.EPOLLIN if reading else 0) | (select.EPOLLOUT if out else 0) or select.EPOLLIN


class _Relay:
    """One client connection: its start-up, then the step loop over both sockets."""

    def __init__(self, proxy: Proxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client_sock = client
        self._wake_read, self._wake_write = socket.socketpair()
        self.server_sock: socket.socket | None = None
        self.memory = Memory()
        self.grouper = Grouper(self.memory)
        self.framer = wire.Framer(proxy.max_message)
        self.reader = wire.BackendReader()
        self.steps: deque[GroupedStep] = deque()
        self.queued = 0
        self.running: tuple[GroupedStep, Tracker] | None = None
        self.discarding = False
        self.to_client = bytearray()
        self.to_server = bytearray()
        self.client_done = False
        """The client sent Terminate (or left): nothing more is read from it."""
        self.client_gone = False
        self.terminate: bytes | None = None
        self.fatal: str | None = None
        """The server's FATAL message, when it ends the connection with one."""
        self.started_up = False
        """Its start-up ended: the hooks know it (by its backend pid) and the client has the server's last answer."""
        self.serial = next(proxy._serials)
        self.answers = 0
        """Counted up before and after each answer to the client (bytes sent, its socket closed): odd while one
        is under way (:meth:`Proxy.answered`). Written by the relay's thread alone."""
        self.ends: tuple[tuple[str, int], tuple[str, int]] | None = None
        """The proxy's end of a TCP connection and the client's (address, port); None on a unix socket."""
        self.client_inode: int | None = 0
        """The inode of the client's socket (0: it has none any more; None: the kernel cannot say)."""
        if client.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                near, far = client.getsockname()[:2], client.getpeername()[:2]
                self.ends = (near, far)
                try:
                    end = tcp_end(far, near)
                    self.client_inode = end.inode if end is not None else 0
                except KernelSilent:
                    self.client_inode = None

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    def run(self) -> None:
        proxy = self.proxy
        client: Client | None = None
        keys: startup.Keys | None = None
        why: str | None = None
        try:
            started = startup.start(self.client_sock, self._wake_read, proxy.closing, proxy.upstream, proxy._cancels)
            self.server_sock, keys = started.server, started.keys
            name = started.parameters.get("application_name") or started.startup.parameters.get("application_name")
            client = Client(proxy._number(), name or None, keys.pid, peer_pid(self.client_sock, self.client_inode))
            proxy.hooks.opened(client)
            self.answers += 1
            try:
                self.client_sock.sendall(started.to_client)
            finally:
                self.answers += 1
            self.started_up = True  # the client has its ReadyForQuery: what it does next is its own
            why = self._loop(client)
        except startup.Ended as ended:
            why = ended.why
        except Refused as refused:
            why = str(refused)
            self._send_quietly(wire.Refusal(refused.sqlstate, why).encode())
        except wire.ProtocolViolation as violation:
            why = str(violation)
            self._send_quietly(wire.Refusal(violation.sqlstate, why).encode())
        except OSError as exc:
            self._last_words()
            why = self.fatal or f"connection lost: {exc}"
        finally:
            self.started_up = True  # ended: nothing more to wait for
            if keys is not None:
                proxy._cancels.remove(keys)
                if self.running is not None and not self.running[1].complete:
                    startup.send_cancel(proxy.upstream, keys)
            self.answers += 1
            for sock in (self.server_sock, self.client_sock, self._wake_read, self._wake_write):
                if sock is not None:
                    sock.close()
            self.answers += 1
            proxy._forget(self)
            if client is not None:
                proxy.hooks.closed(client, why)

    def _last_words(self) -> None:
        """What the server said before it went (its FATAL ErrorResponse), read and passed on to the client."""
        if self.server_sock is None:
            return
        with contextlib.suppress(OSError):
            self.server_sock.setblocking(False)
            while data := self.server_sock.recv(65536):
                self.to_client += data
                self._note_fatal(self.reader.feed(data))
        self._send_quietly(b"")

    def _note_fatal(self, messages: list[wire.Message]) -> None:
        for message in messages:
            if message.code == b"E":
                fields = wire.error_fields(message.body)
                if fields.get("S") in ("FATAL", "PANIC"):
                    self.fatal = fields.get("M")

    def _send_quietly(self, data: bytes) -> None:
        """The client's last bytes, the server's pending ones first; a client that reads nothing does not hold us."""
        pending, self.to_client = bytes(self.to_client) + data, bytearray()
        self.answers += 1
        with contextlib.suppress(OSError):
            self.client_sock.settimeout(LAST_WORDS_TIMEOUT_S)
            self.client_sock.sendall(pending)
        self.answers += 1

    def _loop(self, client: Client) -> str | None:
        """Relay until the client leaves (None), or the server or the proxy ends it (why).

        One epoll set over the three descriptors, read by number: the relay's fixed cost per
        statement is two wake-ups of this loop, so it keeps each one to a few dictionary-free steps.
        """
        server = self.server_sock
        assert server is not None
        self.client_sock.setblocking(False)
        server.setblocking(False)
        client_fd, server_fd, wake_fd = self.client_sock.fileno(), server.fileno(), self._wake_read.fileno()
        with select.epoll(3) as poller:
            poller.register(client_fd, select.EPOLLIN)
            poller.register(server_fd, select.EPOLLIN)
            poller.register(wake_fd, select.EPOLLIN)
            interest = (select.EPOLLIN, select.EPOLLIN)
            while True:
                if self.steps and self.running is None:
                    self._advance(client)
                if self.proxy.closing.is_set():
                    return "the proxy closed"
                if self.client_gone:  # without a Terminate: what it queued is dropped, what runs is cancelled
                    return self.fatal
                if self.client_done and self.running is None and not self.steps and not self.to_server:
                    assert self.terminate is not None
                    self.to_server += self.terminate
                    self.terminate = None
                    self._flush(server, self.to_server)
                    return None
                wanted = (
                    _interest(self.to_client, reading=self._reads_client()),
                    _interest(self.to_server, reading=len(self.to_client) < MAX_WAITING_OUTPUT),
                )
                if wanted != interest:  # epoll_ctl only when it changes: most statements need none
                    if wanted[0] != interest[0]:
                        poller.modify(client_fd, wanted[0])
                    if wanted[1] != interest[1]:
                        poller.modify(server_fd, wanted[1])
                    interest = wanted
                for fd, events in poller.poll():
                    if fd == wake_fd:
                        return "the proxy closed"
                    sock, mask = (self.client_sock, interest[0]) if fd == client_fd else (server, interest[1])
                    # as selectors reads epoll: a hang-up or an error wakes whichever way the socket waits
                    if events & ~select.EPOLLIN and mask & select.EPOLLOUT:
                        self._answer() if fd == client_fd else self._flush(sock, self.to_server)
                    if events & ~select.EPOLLOUT and mask & select.EPOLLIN:
                        if fd == server_fd:
                            if (why := self._from_server(client, server)) is not None:
                                return why
                        else:
                            self._from_client()

    def _answer(self) -> None:
        """Send the client what waits for it, counted in :attr:`answers`."""
        self.answers += 1
        try:
            self._flush(self.client_sock, self.to_client)
        finally:
            self.answers += 1

    def _reads_client(self) -> bool:
        return not self.client_done and self.queued < self.proxy.max_message

    @staticmethod
    def _flush(sock: socket.socket, out: bytearray) -> None:
        try:
            sent = sock.send(out)
        except BlockingIOError:
            return
        del out[:sent]

    @staticmethod
    def _send(sock: socket.socket, out: bytearray, data: bytes) -> None:
        """Send ``data`` after what already waits in ``out``; what the socket does not take waits there.

        With nothing waiting (almost always) the bytes go straight from the buffer they came in,
        with no copy into ``out`` and back.
        """
        if out:
            out += data
            _Relay._flush(sock, out)
            return
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            out += memoryview(data)[sent:]

    def _advance(self, client: Client) -> None:
        """Start the next held step when none is running: ask the hooks, then let its bytes go upstream."""
        while self.running is None and self.steps and not self.proxy.closing.is_set():
            step = self.steps.popleft()
            self.queued -= len(step.statement.data)
            self.proxy.hooks.ready(client, step.statement)
            if self.proxy.closing.is_set():
                return
            tracker = Tracker(step, self.memory, discarding=self.discarding)
            if self.server_sock is not None:
                self._send(self.server_sock, self.to_server, step.statement.data)
            else:
                self.to_server += step.statement.data
            self.running = (step, tracker)
            if tracker.complete:
                self._finish(client)

    def _finish(self, client: Client) -> None:
        assert self.running is not None
        step, tracker = self.running
        self.running = None
        self.discarding = tracker.discarding
        self.proxy.hooks.done(client, step.statement, tracker.reply())

    def _from_client(self) -> None:
        try:
            data = self.client_sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.client_done = self.client_gone = True
            return
        for message in self.framer.feed(data):
            self._client_message(message)
        if self.to_server and self.server_sock is not None:  # COPY data of the running step goes on at once
            self._flush(self.server_sock, self.to_server)

    def _client_message(self, message: wire.Message) -> None:
        if self.terminate is not None:
            raise wire.ProtocolViolation("message after Terminate")
        if message.code == b"X":
            self.terminate = message.raw
            self.client_done = True
            return
        running = self.running[1] if self.running is not None else None
        if not self.steps and not self.grouper.building:
            if is_copy(message):  # COPY data of the running step; or stray, which the server ignores
                self.to_server += message.raw
                return
            if message.code == b"S" and running is not None and running.extra_sync:
                running.extra_sync = False  # the Sync after an extended COPY FROM's CopyDone: part of its step
                self.to_server += message.raw
                return
        step = self.grouper.add(message)
        if step is not None:
            self.steps.append(step)
            self.queued += len(step.statement.data)

    def _from_server(self, client: Client, server: socket.socket) -> str | None:
        try:
            data = server.recv(65536)
        except BlockingIOError:
            return None
        except OSError as exc:
            data, lost = b"", str(exc)
        else:
            lost = "the server closed the connection"
        if not data:
            self._send_quietly(b"")
            return self.fatal or lost
        self.answers += 1
        try:
            self._send(self.client_sock, self.to_client, data)
        finally:
            self.answers += 1
        for message in self.reader.feed(data):
            code = message.code
            if code == b"D":  # most of a result, and never the end of a step: straight to its tracker
                if self.running is not None:
                    self.running[1].row(message)
                continue
            if code == b"S":
                name, value = wire.parameter_status(message.body)
                if name == "application_name":  # pgjdbc names itself with SET after its start-up
                    client.application_name = value or None
            elif code == b"E":
                self._note_fatal([message])
            if self.running is not None and self.running[1].feed(message):
                self._finish(client)
        return None
