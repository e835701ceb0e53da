"""A hub-compatible HTTP server on 127.0.0.1 for download tests: one repository, one revision.

It implements what huggingface_hub 0.36.2 needs for get_hf_file_metadata and hf_hub_download:
HEAD and GET on /{repo_id}/resolve/{revision}/{filename}, answering with X-Repo-Commit,
ETag and Content-Length, plus X-Linked-Size/X-Linked-Etag for the LFS weight file (the
real hub answers those on a redirect; the client reads them before Content-Length). Unknown
files answer 404 with X-Error-Code EntryNotFound, unknown revisions RevisionNotFound.

Every request is logged as (method, path). Faults for tests: advertise a size other than
the bytes served, serve altered bytes, and carry extra files that must never be requested.
"""

from __future__ import annotations

import hashlib
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional

LFS_SUFFIXES = (".safetensors", ".bin")


def git_blob_sha1(data: bytes) -> str:
    """The git object id the hub uses as ETag of a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    """Serve a directory's files as repo_id at revision; use as a context manager."""

    def __init__(
        self,
        directory,
        repo_id: str,
        revision: str,
        *,
        advertise_sizes: Optional[dict] = None,
        alter: Optional[dict] = None,
        extra_files: Optional[dict] = None,
    ):
        """Faults: advertise_sizes name -> size; alter name -> fn(bytes) -> bytes; extra_files name -> bytes."""
        self.repo_id, self.revision = repo_id, revision
        paths = sorted(p for p in Path(directory).iterdir() if p.is_file())
        self.files: dict[str, bytes] = {p.name: p.read_bytes() for p in paths}
        for name, change in (alter or {}).items():
            self.files[name] = change(self.files[name])
        self.files.update(extra_files or {})
        self.advertise_sizes = dict(advertise_sizes or {})
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def endpoint(self) -> str:
        """The base URL to pass as the hub endpoint."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def log(self, method: str, path: str) -> None:
        """Record one request."""
        with self._lock:
            self.requests.append((method, path))

    def requested(self, method: Optional[str] = None) -> list[str]:
        """File names requested so far (optionally for one method), in order."""
        prefix = f"/{self.repo_id}/resolve/"
        with self._lock:
            entries = list(self.requests)
        return [
            urllib.parse.unquote(path[len(prefix):]).split("/", 1)[-1]
            for m, path in entries
            if (method is None or m == method) and path.startswith(prefix)
        ]

    def start(self) -> "HubServer":
        """Bind an ephemeral port on 127.0.0.1 and serve in a daemon thread."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def answer(self, path: str) -> tuple[int, dict, bytes]:
        """Status, headers and body for a resolve path (the body is dropped for HEAD)."""
        prefix = f"/{self.repo_id}/resolve/"
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if not path.startswith(prefix):
            return 404, {"X-Error-Code": "RepoNotFound"}, b"repository not found"
        revision, _, filename = path[len(prefix):].partition("/")
        if revision != self.revision:
            return 404, {"X-Error-Code": "RevisionNotFound"}, b"revision not found"
        commit = {"X-Repo-Commit": self.revision}
        if filename not in self.files:
            return 404, {**commit, "X-Error-Code": "EntryNotFound"}, b"entry not found"
        data = self.files[filename]
        headers = {**commit, "Content-Type": "application/octet-stream"}
        if filename.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers["ETag"] = headers["X-Linked-Etag"] = f'"{sha256}"'
            headers["X-Linked-Size"] = str(self.advertise_sizes.get(filename, len(data)))
        else:
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
            if filename in self.advertise_sizes:
                headers["X-Linked-Size"] = str(self.advertise_sizes[filename])
        return 200, headers, data


def _handler_for(hub: HubServer) -> Callable:
    class Handler(BaseHTTPRequestHandler):
        def _respond(self, with_body: bool) -> None:
            hub.log(self.command, self.path)
            status, headers, body = hub.answer(self.path)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

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
