"""Own HTTP code for the lab's bounds against a hostile hub: one total deadline, sizes before any body, the cap.

huggingface_hub builds the URLs and the headers (its user agent, no token), but cannot keep these bounds: its
timeouts are per socket read (a hub that trickles a byte at a time is never cut off), it follows relative redirects
without a limit and retries. So http.client does the exchange here: a timer shuts every socket down when the
deadline passes; HEAD for every file before any body (remote_metadata); at most MAX_REDIRECTS redirects, never
https to http; no retries; a body read against its advertised size and checked against the hub's ETag. Proxies from
the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) are used through CONNECT.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from inferlab.specimen.spec import SpecimenError, SpecimenSpec

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_REDIRECTS = 5
CHUNK_BYTES = 1 << 16
_HASH_KINDS = {64: "sha256", 40: "git_sha1"}


class DeadlineExpired(SpecimenError):
    """The acquisition deadline passed; the message names the deadline and what was being waited for."""


class Deadline:
    """One total time limit for an acquisition, on the monotonic clock: the lock wait and every byte draw on it."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self._end = time.monotonic() + self.seconds

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        """Whether the end time has passed."""
        return time.monotonic() >= self._end

    def error(self, doing: str) -> DeadlineExpired:
        """The error that names this deadline as the reason an acquisition was cut off while `doing`."""
        return DeadlineExpired(
            f"the acquisition deadline of {self.seconds:g} s expired while {doing}. Nothing partial was kept. A hub "
            f"that stalls or sends too slowly is cut off at this limit (protocol.ACQUISITION_DEADLINE_S); try again "
            f"later, or pass --artifacts DIR with a verified copy.")

    def check(self, doing: str) -> None:
        """Raise DeadlineExpired if the end time has passed."""
        if self.expired():
            raise self.error(doing)


def resolve_endpoint(endpoint: Optional[str] = None) -> str:
    """The hub endpoint: the argument, else HF_ENDPOINT read now (not at import), else huggingface.co."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _proxy_for(scheme: str, host: str) -> Optional[urllib.parse.SplitResult]:
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http":
        raise SpecimenError(f"proxy {proxy!r} for {scheme}: expected an http:// proxy (used through CONNECT), "
                            f"actual scheme {parts.scheme!r}")
    return parts


class Exchange:
    """One request and its answer on a connection of its own, watched until close() by a deadline timer."""

    def __init__(self, method: str, url: str, deadline: Deadline):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SpecimenError(f"{url}: expected an http or https URL")
        self.method, self.url, self.deadline, self.parts = method, url, deadline, parts
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.proxy = _proxy_for(parts.scheme, parts.hostname)
        host, port = (self.proxy.hostname, self.proxy.port or 80) if self.proxy else (parts.hostname, self.port)
        timeout = max(deadline.remaining(), 0.001)
        if parts.scheme == "https":
            import certifi

            # The CA bundle requests would use, so a learner's corporate CA setting keeps working.
            cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or certifi.where()
            context = ssl.create_default_context(cafile=cafile)
            self.conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        else:
            self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        if self.proxy:
            headers = {}
            if self.proxy.username:
                user = f"{urllib.parse.unquote(self.proxy.username)}:{urllib.parse.unquote(self.proxy.password or '')}"
                headers["Proxy-Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
            self.conn.set_tunnel(parts.hostname, self.port, headers=headers)
        self.conn._create_connection = self._create_connection  # http.client's hook for making the socket
        self.response: Optional[http.client.HTTPResponse] = None
        self.fired = False
        self._handle: Optional[socket.socket] = None  # a duplicate of the socket: it survives TLS wrapping
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline.remaining(), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _create_connection(self, address, timeout=None, source_address=None, *args, **kwargs):
        # watched from the first byte: the deadline timer can shut this socket down from now on
        sock = socket.create_connection(address, timeout, source_address, *args, **kwargs)
        with self._lock:
            self._handle = sock.dup()
            fired = self.fired
        if fired:
            self._fire()
        return sock

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._handle is not None:
                try:
                    self._handle.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its owner

    def send(self, doing: str) -> "Exchange":
        """Connect, send the request (huggingface_hub's headers: its user agent, no token, no compression) and read
        the answer's head; errors name the URL, and the deadline when it was the cause."""
        from huggingface_hub.utils import build_hf_headers

        host = f"{self.conn.host}:{self.conn.port}"
        try:
            try:
                self.conn.connect()
            except OSError as error:
                if self.deadline.expired() or self.fired:
                    raise self.deadline.error(f"connecting to {host} for {doing}") from error
                via = f" through the proxy {host}" if self.proxy else ""
                raise SpecimenError(
                    f"{self.parts.scheme}://{self.parts.netloc}: expected the hub endpoint to accept a connection "
                    f"(host {self.parts.hostname}, port {self.port}{via}), actual: {type(error).__name__}: {error}. "
                    f"Nothing was downloaded. Offline? Pass --artifacts DIR with a verified copy.") from error
            headers = {**build_hf_headers(token=False, library_name="inferlab"), "Accept-Encoding": "identity"}
            target = self.parts.path + (f"?{self.parts.query}" if self.parts.query else "")
            self.conn.request(self.method, target, headers=headers)
            self.response = self.conn.getresponse()
        except (OSError, http.client.HTTPException) as error:
            self.close()
            if self.deadline.expired() or self.fired:
                raise self.deadline.error(f"waiting for the answer to {self.method} {self.url} ({doing})") from error
            raise SpecimenError(f"{self.method} {self.url}: expected an HTTP answer, actual {type(error).__name__}: "
                                f"{error}. Nothing was kept.") from error
        except BaseException:
            self.close()
            raise
        return self

    def header(self, name: str) -> Optional[str]:
        return self.response.getheader(name)

    def close(self) -> None:
        self._timer.cancel()
        if self.response is not None:
            self.response.close()
        self.conn.close()
        with self._lock:
            if self._handle is not None:
                self._handle.close()


def open_following(method: str, url: str, deadline: Deadline, *, follow_absolute: bool,
                   doing: str) -> tuple[Exchange, list[str]]:
    """Request url and follow its redirects (relative ones only unless follow_absolute): (exchange, hops).

    At most MAX_REDIRECTS hops and never from https to http; a longer chain is refused.
    """
    hops, current = [], url
    while True:
        deadline.check(doing)
        exchange = Exchange(method, current, deadline).send(doing)
        location = exchange.header("Location")
        if not (300 <= exchange.response.status < 400 and location):
            return exchange, hops
        if urllib.parse.urlsplit(location).netloc and not follow_absolute:
            return exchange, hops  # the hub's redirect to its CDN carries the metadata itself
        exchange.close()
        target = urllib.parse.urljoin(current, location)
        if len(hops) >= MAX_REDIRECTS:
            raise SpecimenError(f"{method} {url}: expected the file within {MAX_REDIRECTS} redirects, actual more "
                                f"({' -> '.join(hops[:3])} -> ...): the hub redirects in a loop; nothing was "
                                f"downloaded")
        if current.startswith("https:") and not target.startswith("https:"):
            raise SpecimenError(f"{method} {current}: redirected from https to {target}; refused (no downgrade)")
        hops.append(target)
        current = target


def file_metadata(url: str, deadline: Deadline, name: str) -> dict:
    """HEAD one file (no body): {url, http_status, error_code, commit, size, etag, lfs, redirects}."""
    from huggingface_hub import constants

    exchange, hops = open_following("HEAD", url, deadline, follow_absolute=False,
                                    doing=f"reading the metadata of {name}")
    try:
        status = exchange.response.status
        answered = status == 200 or 300 <= status < 400
        linked = exchange.header(constants.HUGGINGFACE_HEADER_X_LINKED_SIZE)
        size = linked if linked is not None else exchange.header("Content-Length") if status == 200 else None
        etag = exchange.header(constants.HUGGINGFACE_HEADER_X_LINKED_ETAG) or exchange.header("ETag")
        return {"url": url, "http_status": status, "error_code": exchange.header("X-Error-Code"),
                "commit": exchange.header(constants.HUGGINGFACE_HEADER_X_REPO_COMMIT),
                "size": int(size) if answered and size and size.isdigit() else None,
                "etag": etag.lstrip().removeprefix("W/").strip('"') if answered and etag else None,
                "lfs": linked is not None, "redirects": hops}
    finally:
        exchange.close()


def remote_metadata(spec: SpecimenSpec, endpoint: Optional[str], deadline: Deadline) -> dict:
    """HEAD each allowlisted file at the pinned revision: {endpoint, files, total_bytes, problems, absent_at_revision}.

    files maps name -> file_metadata() plus status "present", "absent_at_revision" (404 EntryNotFound at the pinned
    commit) or "unavailable"; problems lists every reason to refuse the download before a body is asked for.
    """
    from huggingface_hub import hf_hub_url

    endpoint = resolve_endpoint(endpoint)
    files, problems = {}, []
    for name in spec.files:
        url = hf_hub_url(spec.repo_id, name, revision=spec.revision, endpoint=endpoint)
        files[name] = file_metadata(url, deadline, name)
        problems.extend(_metadata_problems(spec, name, files[name]))
    total = sum(meta["size"] or 0 for meta in files.values() if meta["status"] == "present")
    if total > spec.bundle_cap_bytes:
        problems.append(f"bundle: expected at most {spec.bundle_cap_bytes} bytes, actual {total} bytes advertised")
    return {"endpoint": endpoint, "files": files, "total_bytes": total, "problems": problems,
            "absent_at_revision": [name for name, meta in files.items() if meta["status"] == "absent_at_revision"]}


def _metadata_problems(spec: SpecimenSpec, name: str, meta: dict) -> list[str]:
    status, code, where = meta["http_status"], meta["error_code"], f"{name} at {spec.repo_id}@{spec.revision}"
    # The URL names the pinned commit, so EntryNotFound means that commit has no such file (the hub usually
    # confirms the commit in X-Repo-Commit; a 404 naming another commit is not this case).
    if status == 404 and code == "EntryNotFound" and meta["commit"] in (spec.revision, None):
        meta["status"] = "absent_at_revision"
        if name in spec.required_files:
            return [f"{where}: expected a file, actual: HTTP 404 EntryNotFound (the revision has no such file, and "
                    f"the experiment requires it)"]
        if spec.pinned_present(name):
            return [f"{where}: the spec pins it present, actual: HTTP 404 EntryNotFound"]
        return []  # optional: recorded as absent at the revision, never substituted
    if not (status == 200 or 300 <= status < 400):
        meta["status"] = "unavailable"
        hint = " (a server error; nothing was retried or downloaded: try again later)" if status >= 500 else ""
        return [f"{where}: expected a file, actual: HTTP {status}{f' {code}' if code else ''}{hint} ({meta['url']})"]
    meta["status"] = "present"
    problems, pinned, size = [], spec.expected[name].get("size"), meta["size"]
    if meta["commit"] != spec.revision:
        problems.append(f"{name}: expected commit {spec.revision}, actual commit {meta['commit']}")
    if spec.pinned_absent(name):
        problems.append(f"{name}: the spec pins it absent at the revision, actual: the hub lists it ({size} bytes)")
    if size is None:
        problems.append(f"{name}: expected an advertised size, actual: none")
    elif size > spec.bundle_cap_bytes:
        problems.append(f"{name}: expected at most {spec.bundle_cap_bytes} bytes (the bundle cap), actual {size} "
                        f"bytes advertised")
    elif pinned is not None and size != pinned:
        problems.append(f"{name}: expected {pinned} bytes (pinned), actual {size} bytes advertised")
    return problems


def fetch(url: str, name: str, size: int, etag: Optional[str], destination: Path, deadline: Deadline) -> dict:
    """GET one body into destination (created new), exactly `size` bytes: {bytes, sha256, etag_check, redirects}.

    Refused (SpecimenError) when the status is not 200, the Content-Length differs from `size`, the body runs
    longer or ends shorter, or its hash differs from a checkable ETag; DeadlineExpired when the deadline passes
    first. The caller removes destination on failure.
    """
    exchange, hops = open_following("GET", url, deadline, follow_absolute=True, doing=f"requesting the body of {name}")
    received, sha256, git_sha1 = 0, hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)

    def doing() -> str:
        return f"receiving {name} ({received} of {size} bytes so far)"

    try:
        status, length = exchange.response.status, exchange.header("Content-Length")
        if status != 200:
            hint = " (a server error; nothing was retried: try again later)" if status >= 500 else ""
            raise SpecimenError(f"GET {url}: expected HTTP 200 with the body of {name}, actual HTTP {status}{hint}. "
                                f"Nothing was kept.")
        if length is not None and length != str(size):
            raise SpecimenError(f"{name}: the metadata advertised {size} bytes, actual Content-Length {length} on the "
                                f"body ({url}); refused before reading it")
        with open(destination, "xb") as out:
            while True:
                deadline.check(doing())
                # read1: what one read returns, so the deadline is checked between small chunks too
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
        if deadline.expired() or exchange.fired:
            raise deadline.error(doing()) from error
        raise SpecimenError(f"{name}: the connection failed after {received} of {size} bytes "
                            f"({type(error).__name__}: {error}); nothing was kept") from error
    finally:
        exchange.close()
    if received < size:
        if deadline.expired() or exchange.fired:
            raise deadline.error(doing())
        raise SpecimenError(f"{name}: the body ended after {received} of the {size} bytes advertised ({url}); "
                            f"nothing was kept")
    digests = {"sha256": sha256.hexdigest(), "git_sha1": git_sha1.hexdigest()}
    kind = _HASH_KINDS.get(len(etag or "")) if re.fullmatch(r"[0-9a-f]*", etag or "") else None
    if kind is not None and digests[kind] != etag:
        raise SpecimenError(f"{name}: the body's {kind} is {digests[kind]}, but the hub's ETag for this file is "
                            f"{etag}: the bytes differ from what the hub describes; refused")
    return {"bytes": received, "sha256": digests["sha256"], "etag_check": "matches" if kind else "not checkable",
            "redirects": hops}
