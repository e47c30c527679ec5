"""The worker side of the bridge (docs/python-bridge.md).

The agent-sandbox server starts the template's script again with ABX_BRIDGE_FDS set;
when the script calls start()/serve(), this module takes over: it sends the manifest
on the control socket (the first descriptor), answers pings there, and serves calls on
the others, one thread per call as ThreadingHTTPServer would.
"""

import json
import os
import queue
import socket
import sys
import threading
import traceback

from ._messages import Request, ServerResponse, SSEResponse

# Events a streaming route may run ahead of the client; the server grants one more per
# event it has passed on, so a slow client cannot make either side buffer without bound.
STREAM_WINDOW = 16
# ThreadingHTTPServer starts a thread per request without a bound; this is a bound
# high enough that only a runaway stops new calls from starting (they then queue).
MAX_CALL_THREADS = 1024


def _encode(value):
    return json.dumps(value, default=str, allow_nan=False)


def _clean_text(text):
    """Text as valid UTF-8: lone surrogates (a surrogateescape'd file name) become '?'."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _message(exc):
    try:
        return _clean_text(str(exc))
    except BaseException:
        return f"<{type(exc).__name__} whose str() failed>"


def _error_body(exc):
    return _encode({"error": _message(exc), "type": type(exc).__name__})


class _Environment:
    """POST /env's variables as the server passes them on: each call socket sends the
    whole set with its version, and only a newer set is applied, so a socket read late
    cannot bring back an older value."""

    def __init__(self):
        self.lock = threading.Lock()
        self.version = 0

    def apply(self, message):
        version = message.get("env_version", 0)
        with self.lock:
            if version and version <= self.version:
                return
            os.environ.update(message["env"])
            self.version = max(self.version, version)


class _Pool:
    """Threads that run calls: one more is started whenever a call arrives and none is
    idle, up to MAX_CALL_THREADS, so concurrent calls never wait for each other (as with
    ThreadingHTTPServer's thread per request) while a steady load reuses threads. A
    SimpleQueue hand-off costs less than concurrent.futures' per-call Future."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.threads = 0

    def submit(self, function, *args):
        with self.lock:
            start = self.idle == 0 and self.threads < MAX_CALL_THREADS
            if start:
                self.threads += 1
            else:
                self.idle -= 1
        if start:
            try:
                threading.Thread(target=self.work, name=f"abx-call-{self.threads}", daemon=True).start()
            except RuntimeError:
                # No thread to be had (a pids limit): the call waits for a running one.
                with self.lock:
                    self.threads -= 1
                    self.idle -= 1
        self.jobs.put((function, args))

    def work(self):
        while True:
            function, args = self.jobs.get()
            try:
                function(*args)
            except BaseException:
                # A call that cannot even answer (its socket broke mid-write, an
                # exception whose str() raises) must not take the thread down with it.
                traceback.print_exc()
            with self.lock:
                self.idle += 1


class _Stream:
    def __init__(self):
        self.credit = threading.Semaphore(STREAM_WINDOW)
        self.cancelled = False


class _Link:
    """One call socket: requests in, answers out, many calls in flight."""

    def __init__(self, server, sock, executor, environment):
        self.server = server
        self.sock = sock
        self.executor = executor
        self.environment = environment
        self.send_lock = threading.Lock()
        self.streams = {}

    def send_line(self, text):
        data = (text + "\n").encode()
        with self.send_lock:
            self.sock.sendall(data)

    def answer(self, call_id, status, body_json):
        if not isinstance(status, int) or not 200 <= status <= 599:
            body_json = _encode({"error": f"the handler answered with status {status!r}; use 200-599",
                                 "type": "ValueError"})
            status = 500
        self.send_line('{"id":%d,"status":%d,"body":%s}' % (call_id, status, body_json))

    def serve(self):
        try:
            self._serve()
        except BaseException:
            # A broken call socket would leave the server's calls on it waiting forever:
            # end the worker instead, and the supervisor starts a fresh one.
            traceback.print_exc()
            os._exit(70)
        # The server closed the socket: it is going away.
        os._exit(0)

    def _serve(self):
        reader = self.sock.makefile("rb")
        for line in reader:
            message = json.loads(line)
            call_id = message["id"]
            if "env" in message:
                # POST /env on the server: later calls (and what they spawn) see it.
                self.environment.apply(message)
            op = message.get("op")
            if op == "command":
                self.executor.submit(self.run_command, call_id, message)
            elif op == "route":
                self.executor.submit(self.run_route, call_id, message)
            elif op == "ack":
                stream = self.streams.get(call_id)
                if stream is not None:
                    stream.credit.release()
            elif op == "cancel":
                stream = self.streams.get(call_id)
                if stream is not None:
                    stream.cancelled = True
                    stream.credit.release()

    def run_command(self, call_id, message):
        try:
            status, body = self.call_command(message)
        except BaseException as exc:  # whatever happens, the server gets an answer
            status, body = 500, _error_body(exc)
        try:
            self.answer(call_id, status, body)
        except OSError:
            pass  # the socket is gone; the server no longer waits for this answer

    def call_command(self, message):
        command = self.server.registry.get(message["name"])
        if command is None:
            return 404, _encode({"error": f"Unknown command: {message['name']}", "type": "ValueError"})
        kwargs = message.get("args", {})
        # Omitted arguments take the registered default as the original object (the
        # server leaves them out rather than send a JSON copy).
        for arg in command.args:
            if arg.name not in kwargs and not arg.required and arg.default is not None:
                kwargs[arg.name] = arg.default
        return 200, _encode({"result": command.func(**kwargs)})

    def run_route(self, call_id, message):
        try:
            answer = self.call_route(call_id, message)
        except BaseException as exc:
            answer = (500, _error_body(exc))
        if answer is None:
            return  # streamed
        try:
            self.answer(call_id, *answer)
        except OSError:
            pass

    def call_route(self, call_id, message):
        route = self.server.table.get(message["route"])
        if route is None:
            return 404, _encode({"error": f"Unknown route: {message['route']}", "type": "ValueError"})
        response = route.func(Request(message.get("request", {})))
        if isinstance(response, SSEResponse):
            self.stream(call_id, response.event_iterator)
            return None
        if isinstance(response, ServerResponse):
            return response.status, _encode(response.body)
        if isinstance(response, dict):
            return 200, _encode(response)
        raise TypeError(f"route {route.name} returned {type(response).__name__}; return ServerResponse or SSEResponse")

    def stream(self, call_id, events):
        state = _Stream()
        self.streams[call_id] = state
        try:
            for chunk in events:
                state.credit.acquire()
                if state.cancelled:
                    return
                if isinstance(chunk, bytes):
                    chunk = chunk.decode("utf-8", "replace")
                chunk = _clean_text(str(chunk))
                if not chunk.endswith("\n\n"):
                    # An unterminated event would run into the next one.
                    chunk = chunk.rstrip("\n") + "\n\n"
                self.send_line(_encode({"id": call_id, "event": chunk}))
            self.send_line('{"id":%d,"end":true}' % call_id)
        except OSError:
            pass  # the socket is gone
        except BaseException as exc:
            if not state.cancelled:
                try:
                    self.send_line(_encode({"id": call_id, "end": True,
                                            "error": {"message": _message(exc), "type": type(exc).__name__}}))
                except OSError:
                    pass
        finally:
            self.streams.pop(call_id, None)
            close = getattr(events, "close", None)
            if close is not None:
                try:
                    close()
                except BaseException:
                    pass


def run_worker(server):
    """Serves the bridge for ``server`` (a SandboxServer) until the server goes away."""
    fds = [int(fd) for fd in os.environ.pop("ABX_BRIDGE_FDS").split(",")]
    for fd in fds:
        # Subprocesses a command starts must not hold the server's sockets open.
        os.set_inheritable(fd, False)
    control = socket.socket(fileno=fds[0])
    # Defaults and descriptions that JSON cannot hold (a Path, an Enum, inf) are listed
    # as their str(), as the reference's encoder shows them.
    manifest = json.dumps({"manifest": server.manifest()}, default=str)
    control.sendall((manifest + "\n").encode())
    executor = _Pool()
    environment = _Environment()
    for fd in fds[1:]:
        link = _Link(server, socket.socket(fileno=fd), executor, environment)
        threading.Thread(target=link.serve, name=f"abx-link-{fd}", daemon=True).start()
    sys.stdout.flush()
    for line in control.makefile("rb"):
        message = json.loads(line)
        if "ping" in message:
            control.sendall(b'{"pong":%d}\n' % message["ping"])
    os._exit(0)
