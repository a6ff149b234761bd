"""A direct connection between the engine's server and its sites (``--engine treeflare``'s default transport): one
request per tree level makes the round trip the engine's pace, and a FLARE aux message costs about 50 ms of it in
the simulator against a few ms of histogram work (``scripts/bench_xgb_engine.py``). No NVFlare here.

The FL server listens on ``--xgb-port`` (0: any free port) while the job trains; each site connects once, after its
setup task, and answers every later request on that connection. Frames are ``crypto.workers``' (a JSON header,
then byte blobs; numpy arrays travel as blobs with their dtype and shape): no pickle, every size bounded on read.

Who is on the other end: in POC and production mutual TLS with the startup kits' certificates (the server's, checked
against the site's root CA and the server name in its kit; the site's, checked against the server's root CA, and its
common name must be the site it says it is); in the simulator plain TCP on this machine with the job's random token
(the XGBoost direct transport's rule: the simulator is for trusted machines). A request goes to every site before
any reply is read; a site that fails, closes or stays silent past the timeout is named.
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import struct
import time

import numpy as np

from ...crypto.workers import write_frame

MAX_HEADER = 64 << 20
MAX_BLOBS = 4096
MAX_BLOB = 1 << 30
DTYPES = ("uint8", "uint64", "int64", "int32", "float32", "float64")


class ChannelError(RuntimeError):
    """The connection failed or a peer broke the protocol; the message names the site."""


def new_token() -> str:
    return secrets.token_hex(16)


# -- frames: plain values, numpy arrays as blobs -----------------------------------------------------
def pack(value) -> tuple[dict, list]:
    blobs: list = []

    def walk(v):
        if isinstance(v, np.ndarray):
            if v.dtype.name not in DTYPES:
                raise ChannelError(f"cannot send an array of {v.dtype}")
            blobs.append(np.ascontiguousarray(v).tobytes())
            return {"__array__": len(blobs) - 1, "dtype": v.dtype.name, "shape": list(v.shape)}
        if isinstance(v, dict):
            if "__array__" in v:
                raise ChannelError("a dict may not use the key __array__")
            return {str(k): walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v

    return {"v": walk(value)}, blobs


def unpack(header: dict, blobs: list):
    def walk(v):
        if isinstance(v, dict):
            if "__array__" in v:
                i, dtype, shape = v.get("__array__"), v.get("dtype"), v.get("shape")
                if type(i) is not int or not 0 <= i < len(blobs) or dtype not in DTYPES or \
                        not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):  # noqa: E721
                    raise ChannelError("a malformed array in a frame")
                a = np.frombuffer(blobs[i], dtype=dtype)
                if a.size != int(np.prod(shape, dtype=np.int64)):
                    raise ChannelError("an array's shape does not match its bytes")
                return a.reshape(shape).copy()
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(header.get("v"))


class _Conn:
    """One connection, framed; ``who`` names the peer in errors."""

    def __init__(self, sock, who: str, timeout: float):
        # small frames, one answer each: without this, Nagle's algorithm and delayed ACKs add ~40 ms a round trip
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.who = sock, who
        self.last_site_s = None
        self.sock.settimeout(timeout)
        self.fh = sock.makefile("rwb")

    def send(self, value) -> None:
        header, blobs = pack(value)
        try:
            write_frame(self.fh, header, blobs)
        except (OSError, ValueError) as exc:
            raise ChannelError(f"{self.who}: the connection failed while sending ({type(exc).__name__})") from None

    def receive(self):
        try:
            (hl,) = struct.unpack("<I", self._exact(4))
            if hl > MAX_HEADER:
                raise ChannelError(f"{self.who}: a frame header of {hl} bytes (at most {MAX_HEADER})")
            header = json.loads(self._exact(hl))
            (nb,) = struct.unpack("<I", self._exact(4))
            if nb > MAX_BLOBS:
                raise ChannelError(f"{self.who}: {nb} blobs in a frame (at most {MAX_BLOBS})")
            blobs = []
            for _ in range(nb):
                (bl,) = struct.unpack("<Q", self._exact(8))
                if bl > MAX_BLOB:
                    raise ChannelError(f"{self.who}: a blob of {bl} bytes (at most {MAX_BLOB})")
                blobs.append(self._exact(bl))
        except socket.timeout:
            raise ChannelError(f"{self.who}: no reply within {self.sock.gettimeout()} s") from None
        except (OSError, ValueError, struct.error) as exc:
            raise ChannelError(f"{self.who}: the connection failed ({type(exc).__name__})") from None
        if not isinstance(header, dict):
            raise ChannelError(f"{self.who}: a frame header that is not a dict")
        return unpack(header, blobs)

    def _exact(self, n: int) -> bytes:
        data = self.fh.read(n)
        if data is None or len(data) != n:
            raise ChannelError(f"{self.who}: the connection closed")
        return data

    def close(self) -> None:
        for c in (self.fh, self.sock):
            try:
                c.close()
            except OSError:
                pass


def _peer_name(sock) -> str | None:
    cert = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


class ChannelServer:
    """The FL server's side: listens, takes one connection from each of ``sites``, then asks them requests."""

    def __init__(self, sites, token: str, port: int = 0, tls=None, timeout: float = 600.0):
        self.sites, self.token, self.timeout = list(sites), str(token), float(timeout)
        self.conns: dict = {}
        self.last_site_s = 0.0  # the slowest site's own work on the last request
        self.listener = socket.create_server(("0.0.0.0", int(port)), reuse_port=False)
        self.port = self.listener.getsockname()[1]
        self.context = None
        if tls is not None:  # mutual TLS: the server's kit certificate, sites' certificates from the root CA
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.minimum_version = ssl.TLSVersion.TLSv1_2
            self.context.load_cert_chain(tls.cert, tls.key)
            self.context.load_verify_locations(tls.ca)
            self.context.verify_mode = ssl.CERT_REQUIRED

    def accept_all(self, deadline_s: float) -> None:
        """Wait until every site has connected and said who it is (its certificate's name, with TLS)."""
        end = time.monotonic() + deadline_s
        while set(self.conns) != set(self.sites):
            left = end - time.monotonic()
            if left <= 0:
                missing = sorted(set(self.sites) - set(self.conns))
                raise ChannelError(f"{', '.join(missing)}: did not connect to the engine's port {self.port} within "
                                   f"{deadline_s:.0f} s")
            self.listener.settimeout(min(left, 1.0))
            try:
                raw, _ = self.listener.accept()
            except socket.timeout:
                continue
            self._greet(raw)

    def _greet(self, raw) -> None:
        try:
            sock = self.context.wrap_socket(raw, server_side=True) if self.context else raw
            conn = _Conn(sock, "a connecting site", 30.0)
            hello = conn.receive()
        except (ChannelError, ssl.SSLError, OSError):
            raw.close()  # someone without a certificate of this project, or not speaking the protocol
            return
        site = hello.get("site") if isinstance(hello, dict) else None
        ok = site in self.sites and site not in self.conns and \
            secrets.compare_digest(str(hello.get("token", "")), self.token)
        if ok and self.context is not None:
            ok = _peer_name(sock) == site  # a site's certificate names it: no site answers for another
        if not ok:
            conn.close()
            return
        conn.who = site
        conn.sock.settimeout(self.timeout)
        self.conns[site] = conn

    def ask(self, request) -> dict:
        """Send ``request`` to every site, then read every reply: {site: reply}; a site's error reply raises."""
        for site in self.sites:
            self.conns[site].send(request)
        replies = {}
        for site in self.sites:
            reply = self.conns[site].receive()
            if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
                raise ChannelError(f"{site}: a reply that is not the protocol's")
            if not reply["ok"]:
                raise ChannelError(f"{site}: {str(reply.get('error'))[:2000]}")
            t = reply.get("site_s")
            self.conns[site].last_site_s = float(t) if isinstance(t, float) and 0 <= t < 1e6 else None
            replies[site] = reply.get("reply")
        times = [r for r in (self.conns[s].last_site_s for s in self.sites) if r is not None]
        self.last_site_s = max(times, default=0.0)
        return replies

    def close(self) -> None:
        for conn in self.conns.values():
            try:
                conn.send({"bye": True})
            except ChannelError:
                pass
            conn.close()
        self.conns = {}
        self.listener.close()


def connect(host: str, port: int, site: str, token: str, tls=None, timeout: float = 600.0,
            connect_timeout: float = 60.0) -> _Conn:
    """A site's connection to the engine's port, with its hello sent (TLS: its kit's certificate, the server's
    checked against the root CA and ``host``)."""
    end = time.monotonic() + connect_timeout
    while True:
        try:
            raw = socket.create_connection((host, int(port)), timeout=min(10.0, connect_timeout))
            break
        except OSError:
            if time.monotonic() > end:
                raise ChannelError(f"{site}: cannot reach the engine's port {host}:{port}") from None
            time.sleep(0.2)
    sock = raw
    if tls is not None:
        context = ssl.create_default_context(cafile=tls.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls.cert, tls.key)
        sock = context.wrap_socket(raw, server_hostname=host)
    conn = _Conn(sock, "the server", timeout)
    conn.send({"site": site, "token": token})
    return conn


def serve(conn: _Conn, handle, public_error) -> None:
    """A site's loop: answer each request with ``handle(request)`` until the server says bye or closes; a failure is
    an error reply (``public_error(exc)``: never a value or a path), then the loop ends."""
    while True:
        try:
            request = conn.receive()
        except ChannelError:
            return
        if isinstance(request, dict) and request.get("bye"):
            conn.close()
            return
        try:
            t = time.perf_counter()
            reply = handle(request)
            conn.send({"ok": True, "reply": reply, "site_s": time.perf_counter() - t})
        except Exception as exc:  # noqa: BLE001 - the server hears what failed, the site's log has the rest
            try:
                conn.send({"ok": False, "error": public_error(exc)})
            finally:
                conn.close()
            return
