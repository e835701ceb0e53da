"""A hub-compatible HTTP server on 127.0.0.1 for download tests: one repository, one revision, and faults.

It answers what the real hub answers to a client that resolves files at a revision:

- HEAD/GET /{repo_id}/resolve/{revision}/{filename} with X-Repo-Commit, ETag and Content-Length;
  a regular file's ETag is its git blob sha1;
- for an LFS file (*.safetensors, *.bin) the real hub answers 302 to its CDN with X-Linked-Size and
  X-Linked-Etag (the sha256); here the CDN is /cdn/{sha256} on the same server;
- unknown files answer 404 with X-Error-Code EntryNotFound (and X-Repo-Commit), unknown revisions
  RevisionNotFound.

Every request is logged as (method, path), its headers in `headers`. Faults for tests:

- advertise_sizes: name -> size in the metadata; extra_files: name -> bytes (listed, must never be requested);
- faults: (method, name) -> mode, where method is "HEAD", "GET" or "*" and name a file name or "*"
  (for an LFS file a GET fault applies to the CDN request that carries the body). Modes:
    stall            accept the connection and the request, then send nothing
    trickle_headers  send the status line and headers one byte every 0.2 s, never finishing
    trickle          send correct headers, then the body 4 bytes every 0.25 s
    redirect_forever answer 302 to the same path (relative) with a new query, forever
    500              answer HTTP 500
    reset            advertise the full length, send half the body, then reset the connection (RST)
    truncated        advertise the full length, send half the body, then close normally
    longer           a body longer than the metadata said, with a Content-Length that admits it
    shorter          a body shorter than the metadata said, with a Content-Length that admits it
    longer_no_length a longer body with no Content-Length (ends when the connection closes)
    wrong_bytes      the right length and the original's headers, one byte changed
    hold             set `held`, wait until the test sets `release`, then answer normally
"""

from __future__ import annotations

import hashlib
import select
import socket
import socketserver
import struct
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional

LFS_SUFFIXES = (".safetensors", ".bin")
BODY_MODES = ("trickle", "reset", "truncated", "longer", "shorter", "longer_no_length", "wrong_bytes")
ANY_TIME_MODES = ("stall", "trickle_headers", "redirect_forever", "500", "hold")


def git_blob_sha1(data: bytes) -> str:
    """The git object id the hub uses as ETag of a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client cut off by its deadline is the point of these tests, not an error


class HubServer:
    """Serve a directory's files as repo_id at revision; use as a context manager."""

    def __init__(
        self,
        directory,
        repo_id: str,
        revision: str,
        *,
        advertise_sizes: Optional[dict] = None,
        extra_files: Optional[dict] = None,
        faults: Optional[dict] = None,
    ):
        self.repo_id, self.revision = repo_id, revision
        paths = sorted(p for p in Path(directory).iterdir() if p.is_file())
        self.files: dict[str, bytes] = {p.name: p.read_bytes() for p in paths}
        self.files.update(extra_files or {})
        self.advertise_sizes = dict(advertise_sizes or {})
        self.faults = dict(faults or {})
        for (method, name), mode in self.faults.items():
            if mode not in BODY_MODES + ANY_TIME_MODES or method not in ("HEAD", "GET", "*"):
                raise ValueError(f"fault ({method}, {name}): unknown mode {mode!r}")
        self.requests: list[tuple[str, str]] = []
        self.headers: list[dict] = []
        self.stopping = threading.Event()
        self.held, self.release = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def endpoint(self) -> str:
        """The base URL to pass as the hub endpoint."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def log(self, method: str, path: str, headers: Optional[dict] = None) -> None:
        """Record one request."""
        with self._lock:
            self.requests.append((method, path))
            self.headers.append(dict(headers or {}))

    def requested(self, method: Optional[str] = None) -> list[str]:
        """File names requested at resolve paths so far (optionally for one method), in order."""
        prefix = f"/{self.repo_id}/resolve/"
        with self._lock:
            entries = list(self.requests)
        return [
            urllib.parse.unquote(urllib.parse.urlsplit(path).path[len(prefix):]).split("/", 1)[-1]
            for m, path in entries
            if (method is None or m == method) and path.startswith(prefix)
        ]

    def gets(self) -> list[str]:
        """Every GET path so far, resolve and CDN alike: a body was requested if this is not empty."""
        with self._lock:
            return [path for method, path in self.requests if method == "GET"]

    def metadata_came_first(self) -> bool:
        """Whether every HEAD (the metadata pass) came before the first GET (a body)."""
        with self._lock:
            methods = [method for method, _ in self.requests]
        return "GET" not in methods or "HEAD" not in methods[methods.index("GET"):]

    def start(self) -> "HubServer":
        """Bind an ephemeral port on 127.0.0.1 and serve in a daemon thread."""
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every stalled or trickling answer, and release the port."""
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def fault(self, method: str, name: Optional[str]) -> Optional[str]:
        """The fault mode for a request, if any."""
        for key in ((method, name), (method, "*"), ("*", name), ("*", "*")):
            if key in self.faults:
                return self.faults[key]
        return None

    def _file_for_cdn(self, digest: str) -> Optional[str]:
        return next((n for n, d in self.files.items() if hashlib.sha256(d).hexdigest() == digest), None)

    def answer(self, method: str, raw_path: str) -> tuple[int, dict, bytes, Optional[str]]:
        """Status, headers, body and the file name for a request path (the body is dropped for HEAD)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path)
        if path.startswith("/cdn/"):
            name = self._file_for_cdn(path[len("/cdn/"):])
            if name is None:
                return 404, {}, b"no such object", None
            return 200, {"ETag": f'"{hashlib.sha256(self.files[name]).hexdigest()}"'}, self.files[name], name
        prefix = f"/{self.repo_id}/resolve/"
        if not path.startswith(prefix):
            return 404, {"X-Error-Code": "RepoNotFound"}, b"repository not found", None
        revision, _, filename = path[len(prefix):].partition("/")
        if revision != self.revision:
            return 404, {"X-Error-Code": "RevisionNotFound"}, b"revision not found", filename
        commit = {"X-Repo-Commit": self.revision}
        if filename not in self.files:
            return 404, {**commit, "X-Error-Code": "EntryNotFound"}, b"entry not found", filename
        data = self.files[filename]
        headers = {**commit, "Content-Type": "application/octet-stream"}
        if filename.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers["ETag"] = headers["X-Linked-Etag"] = f'"{sha256}"'
            headers["X-Linked-Size"] = str(self.advertise_sizes.get(filename, len(data)))
            headers["Location"] = f"{self.endpoint}/cdn/{sha256}"
            return 302, headers, b"", filename
        else:
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
            if filename in self.advertise_sizes:
                headers["X-Linked-Size"] = str(self.advertise_sizes[filename])
        return 200, headers, data, filename


def _flip_middle(data: bytes) -> bytes:
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    return bytes(changed)


def _handler_for(hub: HubServer) -> Callable:
    class Handler(BaseHTTPRequestHandler):
        def _respond(self, with_body: bool) -> None:
            hub.log(self.command, self.path, self.headers)
            status, headers, body, name = hub.answer(self.command, self.path)
            mode = hub.fault(self.command, name) if name is not None else None
            is_body = with_body and status == 200
            if mode == "stall":
                hub.stopping.wait()
                return
            if mode == "hold":
                hub.held.set()
                while not (hub.release.wait(0.05) or hub.stopping.is_set()):
                    pass
            if mode == "trickle_headers":
                self._trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"." * 100_000, 1, 0.2)
                return
            if mode == "redirect_forever":
                hop = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("hop", ["0"])[0]
                status, headers, body = 302, {"Location": f"{urllib.parse.urlsplit(self.path).path}?hop={int(hop) + 1}"}, b""
            elif mode == "500":
                status, headers, body = 500, {}, b"internal server error"
            elif mode in BODY_MODES and is_body:
                self._body_fault(mode, headers, body)
                return
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def _send_head(self, headers: dict, length: Optional[int]) -> None:
            self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.flush()

        def _trickle(self, data: bytes, step: int, pause: float) -> None:
            for start in range(0, len(data), step):
                if hub.stopping.is_set():
                    return
                try:
                    self.wfile.write(data[start:start + step])
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up
                hub.stopping.wait(pause)

        def _body_fault(self, mode: str, headers: dict, body: bytes) -> None:
            half = body[: len(body) // 2]
            if mode == "trickle":
                self._send_head(headers, len(body))
                self._trickle(body, 4, 0.25)
            elif mode in ("reset", "truncated"):
                self._send_head(headers, len(body))
                self.wfile.write(half)
                self.wfile.flush()
                if mode == "reset":
                    # Linger 0: close sends RST instead of FIN.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            elif mode == "longer":
                self._send_head(headers, len(body) + 64)
                self.wfile.write(body + b"\0" * 64)
            elif mode == "shorter":
                self._send_head(headers, len(half))
                self.wfile.write(half)
            elif mode == "longer_no_length":
                self._send_head(headers, None)
                self.wfile.write(body + b"\0" * 64)
            elif mode == "wrong_bytes":
                self._send_head(headers, len(body))
                self.wfile.write(_flip_middle(body))

        def do_HEAD(self):  # noqa: N802 (http.server's naming)
            self._respond(with_body=False)

        def do_GET(self):  # noqa: N802
            self._respond(with_body=True)

        def do_POST(self):  # noqa: N802 (logged, then refused: the client must not need it)
            hub.log(self.command, self.path)
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass  # the request log above replaces stderr noise

    return Handler


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on 127.0.0.1 that relays bytes and logs each tunnel's target."""

    def __init__(self):
        self.tunnels: list[str] = []
        self._server: Optional[socketserver.ThreadingTCPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "ConnectProxy":
        proxy = self

        class Relay(socketserver.StreamRequestHandler):
            def handle(self):
                request = self.rfile.readline().decode("latin-1").split()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                if len(request) < 2 or request[0] != "CONNECT":
                    self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                    return
                proxy.tunnels.append(request[1])
                host, _, port = request[1].rpartition(":")
                with socket.create_connection((host, int(port)), timeout=10) as upstream:
                    self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    self.wfile.flush()
                    _relay(self.connection, upstream)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Relay)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    sockets = [client, upstream]
    while True:
        readable, _, _ = select.select(sockets, [], [], 10)
        if not readable:
            return
        for source in readable:
            data = source.recv(65536)
            if not data:
                return
            (upstream if source is client else client).sendall(data)
