"""A bounded hub client: HEAD for metadata, GET for bodies, every byte within one acquisition Deadline.

Why not huggingface_hub's own download: its timeouts apply per socket read, so a hub that accepts a
connection and then sends a byte every few seconds (or never finishes its headers) is not bounded,
relative redirects are followed without a limit, and it retries. Here huggingface_hub builds the
URLs and the user agent; http.client does the exchange, and:

- every socket is watched: when the deadline passes, a timer shuts it down, so no blocking read
  (connection, TLS, headers, body) outlives the deadline; per-read timeouts are capped by the time left;
- at most MAX_REDIRECTS redirects, never from https to http;
- no retries: a server error is reported as it is;
- a body is read in chunks against the size the metadata advertised: a longer body is cut off at
  the first extra byte, a shorter one is refused, and its hash is compared with the hub's ETag.
Proxies from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) are used through CONNECT.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from inferlab.specimen.deadline import Deadline
from inferlab.specimen.spec import SpecimenError

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_REDIRECTS = 5
CHUNK_BYTES = 1 << 16
HEADER_REPO_COMMIT = "X-Repo-Commit"
HEADER_LINKED_SIZE = "X-Linked-Size"
HEADER_LINKED_ETAG = "X-Linked-Etag"
OFFLINE_HINT = "Offline? Pass --artifacts DIR with a verified copy of the allowlisted files."
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def resolve_endpoint(endpoint: Optional[str] = None) -> str:
    """The hub endpoint: the argument, else HF_ENDPOINT read now, else huggingface.co."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def file_url(repo_id: str, name: str, revision: str, endpoint: str) -> str:
    """The resolve URL of one file at one revision, as huggingface_hub builds it."""
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, name, revision=revision, endpoint=endpoint)


def request_headers() -> dict:
    """huggingface_hub's user agent, no token, and no compression (sizes must be the real ones)."""
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=False, library_name="inferlab")
    headers["Accept-Encoding"] = "identity"
    return headers


class Watchdog:
    """Shuts down every attached socket when the deadline passes, waking any read blocked on it."""

    def __init__(self, deadline: Deadline):
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.fired = False
        self._timer = threading.Timer(deadline.remaining(), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, sock: socket.socket) -> socket.socket:
        """Watch a connected socket; returns a handle for release(). A duplicate descriptor survives TLS wrapping."""
        handle = sock.dup()
        with self._lock:
            self._sockets.append(handle)
            fired = self.fired
        if fired:
            _shutdown(handle)
        return handle

    def release(self, handle: socket.socket) -> None:
        """Stop watching a socket (its exchange is over)."""
        with self._lock:
            if handle in self._sockets:
                self._sockets.remove(handle)
        handle.close()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            handles = list(self._sockets)
        for handle in handles:
            _shutdown(handle)

    def close(self) -> None:
        """Cancel the timer and release every socket."""
        self._timer.cancel()
        with self._lock:
            handles, self._sockets = self._sockets, []
        for handle in handles:
            handle.close()

    def __enter__(self) -> "Watchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(handle: socket.socket) -> None:
    try:
        handle.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its owner


def _ssl_context():
    import ssl

    # The bundle requests would use, so a learner's corporate CA setting keeps working.
    cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not cafile:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:
            cafile = None
    return ssl.create_default_context(cafile=cafile)


def _proxy_for(scheme: str, host: str) -> Optional[urllib.parse.SplitResult]:
    proxies = urllib.request.getproxies()
    proxy = proxies.get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http":
        raise SpecimenError(f"proxy {proxy!r} for {scheme}: expected an http:// proxy (used through CONNECT), "
                            f"actual scheme {parts.scheme!r}")
    return parts


class Exchange:
    """One request and its response on its own connection; close() releases everything."""

    def __init__(self, method: str, url: str, conn, response, sock, handles: list, watchdog: Watchdog):
        self.method, self.url, self.conn, self.response, self.sock = method, url, conn, response, sock
        self._handles, self._watchdog = handles, watchdog

    @property
    def status(self) -> int:
        return self.response.status

    def header(self, name: str) -> Optional[str]:
        return self.response.getheader(name)

    def close(self) -> None:
        try:
            if self.response is not None:
                self.response.close()
        finally:
            self.conn.close()
            for handle in self._handles:
                self._watchdog.release(handle)


def _connection(parts: urllib.parse.SplitResult, deadline: Deadline, watchdog: Watchdog, handles: list):
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecimenError(f"{parts.geturl()}: expected an http or https URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = _proxy_for(parts.scheme, parts.hostname)
    host, host_port = (proxy.hostname, proxy.port or 80) if proxy else (parts.hostname, port)
    timeout = max(deadline.remaining(), 0.001)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, host_port, timeout=timeout, context=_ssl_context())
    else:
        conn = http.client.HTTPConnection(host, host_port, timeout=timeout)
    if proxy:
        tunnel_headers = {}
        if proxy.username:
            credentials = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
            tunnel_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        conn.set_tunnel(parts.hostname, port, headers=tunnel_headers)

    def create_connection(address, timeout=None, source_address=None, *args, **kwargs):
        # Looked up at call time, so the offline guard's patch applies; watched from the first byte.
        sock = socket.create_connection(address, timeout, source_address, *args, **kwargs)
        handles.append(watchdog.attach(sock))
        return sock

    conn._create_connection = create_connection  # http.client's documented-in-source hook for the socket
    return conn, (parts.hostname, port), proxy


def _exchange(method: str, url: str, deadline: Deadline, watchdog: Watchdog, doing: str) -> Exchange:
    """Send one request without following redirects; errors name the URL, the deadline when it expired."""
    deadline.check(doing)
    parts = urllib.parse.urlsplit(url)
    handles: list = []
    conn, (host, port), proxy = _connection(parts, deadline, watchdog, handles)
    exchange = Exchange(method, url, conn, None, None, handles, watchdog)
    try:
        try:
            conn.connect()
        except OSError as error:
            if deadline.expired():
                raise deadline.error(f"connecting to {host}:{port} for {doing}") from error
            via = f" through the proxy {proxy.hostname}:{proxy.port or 80}" if proxy else ""
            raise SpecimenError(
                f"{parts.scheme}://{parts.netloc}: expected the hub endpoint to accept a connection (host {host}, "
                f"port {port}{via}), actual: {type(error).__name__}: {error}. Nothing was downloaded. {OFFLINE_HINT}"
            ) from error
        exchange.sock = conn.sock
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, headers=request_headers())
        exchange.response = conn.getresponse()
    except (OSError, http.client.HTTPException) as error:
        exchange.close()
        if deadline.expired() or watchdog.fired:
            raise deadline.error(f"waiting for the answer to {method} {url} ({doing})") from error
        raise SpecimenError(f"{method} {url}: expected an HTTP answer, actual {type(error).__name__}: {error}. "
                            f"Nothing was kept.") from error
    except BaseException:
        exchange.close()
        raise
    return exchange


def open_following(method: str, url: str, deadline: Deadline, watchdog: Watchdog, *, follow_absolute: bool,
                   doing: str) -> tuple[Exchange, list[str]]:
    """Request url and follow redirects (relative ones only unless follow_absolute): (exchange, hops).

    At most MAX_REDIRECTS hops and never from https to http; a longer chain is refused.
    """
    hops: list[str] = []
    current = url
    while True:
        exchange = _exchange(method, current, deadline, watchdog, doing)
        location = exchange.header("Location")
        if not (300 <= exchange.status < 400 and location):
            return exchange, hops
        target = urllib.parse.urljoin(current, location)
        if urllib.parse.urlsplit(location).netloc and not follow_absolute:
            return exchange, hops  # the hub's redirect to its CDN carries the metadata itself
        exchange.close()
        if len(hops) >= MAX_REDIRECTS:
            raise SpecimenError(
                f"{method} {url}: expected the file within {MAX_REDIRECTS} redirects, actual more "
                f"({' -> '.join(hops[:3])} -> ...): the hub redirects in a loop; nothing was downloaded")
        if urllib.parse.urlsplit(current).scheme == "https" and urllib.parse.urlsplit(target).scheme != "https":
            raise SpecimenError(f"{method} {current}: redirected from https to {target}; refused (no downgrade)")
        hops.append(target)
        current = target


def normalize_etag(etag: Optional[str]) -> Optional[str]:
    """An ETag without its weak prefix and quotes, as huggingface_hub stores it."""
    if etag is None:
        return None
    return etag.lstrip().removeprefix("W/").strip('"')


def _int_or_none(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def file_metadata(url: str, deadline: Deadline, watchdog: Watchdog, name: str) -> dict:
    """HEAD one file (no body): {url, http_status, error_code, commit, size, etag, lfs, redirects}."""
    exchange, hops = open_following("HEAD", url, deadline, watchdog, follow_absolute=False,
                                    doing=f"reading the metadata of {name}")
    try:
        status = exchange.status
        linked = exchange.header(HEADER_LINKED_SIZE)
        answered = status == 200 or 300 <= status < 400
        length = exchange.header("Content-Length") if status == 200 else None
        return {
            "url": url,
            "http_status": status,
            "error_code": exchange.header("X-Error-Code"),
            "commit": exchange.header(HEADER_REPO_COMMIT),
            "size": _int_or_none(linked if linked is not None else length) if answered else None,
            "etag": normalize_etag(exchange.header(HEADER_LINKED_ETAG) or exchange.header("ETag")) if answered else None,
            "lfs": linked is not None,
            "redirects": hops,
        }
    finally:
        exchange.close()


def etag_kind(etag: Optional[str]) -> Optional[str]:
    """'sha256' or 'git_sha1' when an ETag is a hash the body can be checked against, else None."""
    if etag and _HEX64.match(etag):
        return "sha256"
    if etag and _HEX40.match(etag):
        return "git_sha1"
    return None


def _cap_read_timeout(exchange: Exchange, deadline: Deadline) -> None:
    # http.client closes the socket itself once a Content-Length body is complete.
    try:
        exchange.sock.settimeout(max(deadline.remaining(), 0.001))
    except OSError:
        pass


def fetch(url: str, name: str, size: int, etag: Optional[str], destination: Path, deadline: Deadline,
          watchdog: Watchdog) -> dict:
    """GET one body into destination (created new), exactly `size` bytes: {bytes, sha256, etag_check, redirects}.

    Refused (SpecimenError) when the status is not 200, the Content-Length differs from `size`,
    the body runs longer or ends shorter, or its hash differs from a checkable ETag; DeadlineExpired
    when the deadline passes first. The caller removes destination on failure.
    """
    exchange, hops = open_following("GET", url, deadline, watchdog, follow_absolute=True,
                                    doing=f"requesting the body of {name}")
    received = 0
    try:
        if exchange.status != 200:
            hint = " (a server error; nothing was retried: try again later)" if exchange.status >= 500 else ""
            raise SpecimenError(f"GET {url}: expected HTTP 200 with the body of {name}, actual HTTP {exchange.status}"
                                f"{hint}. Nothing was kept.")
        encoding = (exchange.header("Content-Encoding") or "identity").lower()
        if encoding != "identity":
            raise SpecimenError(f"GET {url}: expected an unencoded body, actual Content-Encoding {encoding}")
        announced = _int_or_none(exchange.header("Content-Length"))
        if exchange.header("Content-Length") is not None and announced != size:
            raise SpecimenError(
                f"{name}: the metadata advertised {size} bytes, actual Content-Length {exchange.header('Content-Length')} "
                f"on the body ({url}); refused before reading it")
        sha256 = hashlib.sha256()
        git_sha1 = hashlib.sha1(b"blob %d\0" % size)
        with open(destination, "xb") as out:
            while True:
                deadline.check(f"receiving {name} ({received} of {size} bytes so far)")
                _cap_read_timeout(exchange, deadline)
                # read1: whatever one read returns, so the deadline is checked between small chunks too.
                chunk = exchange.response.read1(min(CHUNK_BYTES, size - received + 1))
                if not chunk:
                    break
                received += len(chunk)
                if received > size:
                    raise SpecimenError(f"{name}: the body is longer than the {size} bytes advertised ({url}); "
                                        f"refused at the first extra byte")
                out.write(chunk)
                sha256.update(chunk)
                git_sha1.update(chunk)
    except (OSError, http.client.HTTPException) as error:
        if deadline.expired() or watchdog.fired:
            raise deadline.error(f"receiving {name} ({received} of {size} bytes so far)") from error
        raise SpecimenError(f"{name}: the connection failed after {received} of {size} bytes "
                            f"({type(error).__name__}: {error}); nothing was kept") from error
    finally:
        exchange.close()
    if received < size:
        if deadline.expired() or watchdog.fired:
            raise deadline.error(f"receiving {name} ({received} of {size} bytes so far)")
        raise SpecimenError(f"{name}: the body ended after {received} of the {size} bytes advertised ({url}); "
                            f"nothing was kept")
    digests = {"sha256": sha256.hexdigest(), "git_sha1": git_sha1.hexdigest()}
    kind = etag_kind(etag)
    if kind is not None and digests[kind] != etag:
        raise SpecimenError(f"{name}: the body's {kind} is {digests[kind]}, but the hub's ETag for this file is {etag}: "
                            f"the bytes differ from what the hub describes; refused")
    return {"bytes": received, "sha256": digests["sha256"], "etag_check": "matches" if kind else "not checkable",
            "redirects": hops}
