"""A hub-compatible HTTP server on 127.0.0.1 for download tests: one repository, one revision, and faults.

It answers HEAD/GET /{repo_id}/resolve/{revision}/{filename} as the real hub does, an LFS file (*.safetensors, *.bin)
by a 302 to its CDN (/cdn/{sha256} here), and logs every request. faults: (method, name) -> mode (for an LFS file a GET
fault applies to the CDN request that carries the body), as _respond and _body_fault read them. Also a CONNECT proxy.
"""

from __future__ import annotations

import functools
import hashlib
import select
import socket
import struct
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

LFS_SUFFIXES = (".safetensors", ".bin")
BODY_MODES = ("trickle", "reset", "truncated", "longer", "shorter", "longer_no_length", "wrong_bytes")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client cut off by its deadline is the point of these tests, not an error


class HubServer:
    """Serve a directory's files as repo_id at revision, until stop()."""

    def __init__(self, directory, repo_id: str, revision: str, *, advertise_sizes: Optional[dict] = None,
                 extra_files: Optional[dict] = None, faults: Optional[dict] = None):
        self.repo_id, self.revision = repo_id, revision
        self.files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        self.files.update(extra_files or {})
        self.advertise_sizes, self.faults = dict(advertise_sizes or {}), dict(faults or {})
        self.requests: list[tuple[str, str]] = []
        self.tunnels: list[str] = []  # CONNECT targets, when a test uses the hub as its proxy
        self.headers: list[dict] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def requested(self, method: Optional[str] = None) -> list[str]:
        """File names requested at resolve paths so far (optionally for one method), in order."""
        prefix = f"/{self.repo_id}/resolve/"
        with self._lock:
            paths = [path for m, path in self.requests if (method is None or m == method) and path.startswith(prefix)]
        return [urllib.parse.unquote(urllib.parse.urlsplit(path).path[len(prefix):]).split("/", 1)[-1]
                for path in paths]

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
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def answer(self, raw_path: str) -> tuple[int, dict, bytes, Optional[str]]:
        """Status, headers, body and the file name for a request path (the body is dropped for HEAD)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path)
        if path.startswith("/cdn/"):
            name = next((n for n, d in self.files.items() if hashlib.sha256(d).hexdigest() == path[5:]), None)
            if name is None:
                return 404, {}, b"no such object", None
            return 200, {"ETag": f'"{path[5:]}"'}, self.files[name], name
        revision, _, filename = path.removeprefix(f"/{self.repo_id}/resolve/").partition("/")
        if revision != self.revision:
            return 404, {"X-Error-Code": "RevisionNotFound"}, b"revision not found", filename
        if filename not in self.files:
            return 404, {"X-Repo-Commit": self.revision, "X-Error-Code": "EntryNotFound"}, b"entry not found", filename
        data = self.files[filename]
        headers = {"X-Repo-Commit": self.revision, "Content-Type": "application/octet-stream"}
        if filename.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"',
                            "X-Linked-Size": str(self.advertise_sizes.get(filename, len(data))),
                            "Location": f"{self.endpoint}/cdn/{sha256}"})
            return 302, headers, b"", filename
        headers["ETag"] = '"%s"' % hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's object id
        if filename in self.advertise_sizes:
            headers["X-Linked-Size"] = str(self.advertise_sizes[filename])
        return 200, headers, data, filename


def _handler_for(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        def _respond(self, with_body: bool) -> None:
            with hub._lock:
                hub.requests.append((self.command, self.path))
                hub.headers.append(dict(self.headers))
            status, headers, body, name = hub.answer(self.path)
            mode = hub.faults.get((self.command, name))
            if mode == "stall":
                hub.stopping.wait()
            elif mode == "trickle_headers":
                self._trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"." * 100_000, 1, 0.2)
            elif mode in BODY_MODES and with_body and status == 200:
                self._body_fault(mode, headers, body)
            else:
                if mode == "redirect_forever":
                    hop = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("hop", ["0"])[0]
                    status, body = 302, b""
                    headers = {"Location": f"{urllib.parse.urlsplit(self.path).path}?hop={int(hop) + 1}"}
                elif mode == "500":
                    status, headers, body = 500, {}, b"internal server error"
                self._send_head(headers, len(body), status)
                if with_body:
                    self.wfile.write(body)

        def _send_head(self, headers: dict, length: Optional[int], status: int = 200) -> None:
            self.send_response(status)
            for key, value in {**headers, **({} if length is None else {"Content-Length": length})}.items():
                self.send_header(key, str(value))
            self.end_headers()
            self.wfile.flush()

        def _trickle(self, data: bytes, step: int, pause: float) -> None:
            for start in range(0, len(data), step):
                try:
                    self.wfile.write(data[start:start + step])
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up
                if hub.stopping.wait(pause):
                    return

        def _body_fault(self, mode: str, headers: dict, body: bytes) -> None:
            middle = len(body) // 2
            sent = {"longer": body + b"\0" * 64, "longer_no_length": body + b"\0" * 64, "shorter": body[:middle],
                    "reset": body[:middle], "truncated": body[:middle],
                    "wrong_bytes": body[:middle] + bytes([body[middle] ^ 1]) + body[middle + 1:]}.get(mode, body)
            self._send_head(headers, {"longer_no_length": None, "reset": len(body), "truncated": len(body)}.get(
                mode, len(sent)))  # reset and truncated advertise the whole body
            if mode == "trickle":
                return self._trickle(body, 4, 0.25)
            self.wfile.write(sent)
            self.wfile.flush()
            if mode == "reset":  # linger 0: close sends RST instead of FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if mode in ("reset", "truncated"):
                self.connection.close()

        do_HEAD = functools.partialmethod(_respond, with_body=False)  # noqa: N815 (http.server's naming)
        do_GET = functools.partialmethod(_respond, with_body=True)  # noqa: N815

        def do_CONNECT(self):  # noqa: N802: the hub as its own HTTP proxy, a tunnel to the target
            self.close_connection = True
            with hub._lock:
                hub.tunnels.append(self.path)
            host, _, port = self.path.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=10) as upstream:
                self.send_response(200, "Connection established")
                self.end_headers()
                while True:  # relay both ways until one side closes
                    readable, _, _ = select.select([self.connection, upstream], [], [], 10)
                    data = readable[0].recv(65536) if readable else b""
                    if not data:
                        return
                    (upstream if readable[0] is self.connection else self.connection).sendall(data)

        def log_message(self, *args):
            pass  # the request log above replaces stderr noise

    return Handler
