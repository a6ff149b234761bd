"""The engine's own connection between the FL server and its sites (``xgb.engine.channel``): frames of plain values
and numpy arrays (no pickle, sizes bounded), one connection per site that says who it is, mutual TLS with the kits'
certificates (the site's certificate must name the site it claims), and errors that name the site."""

from __future__ import annotations

import datetime
import socket
import struct
import threading

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from test_secagg import make_ca, write_kit, write_pems
from treeflare.xgb.engine import channel
from treeflare.xgb.fedserver import ClientTLS, ServerTLS

SITES = ["site-1", "site-2", "site-3"]


def write_server_kit(folder, ca, host="localhost"):
    ca_key, ca_cert = ca
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    write_pems(folder, "server", key, cert, ca_cert)
    return folder


def start_sites(port, token, names, tls_of=None, handle=None, claimed=None):
    def run(site):
        try:
            tls = tls_of(site) if tls_of else None
            conn = channel.connect("localhost", port, (claimed or {}).get(site, site), token, tls, timeout=30,
                                   connect_timeout=10)
        except Exception:  # noqa: BLE001 - a refused TLS handshake: the server never lists this site
            return
        channel.serve(conn, handle or (lambda req: {"site": site, "twice": req["x"] * 2}), lambda e: str(e))

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in names]
    for t in threads:
        t.start()
    return threads


def test_requests_and_arrays_go_both_ways_and_bye_ends_the_sites():
    server = channel.ChannelServer(SITES, "tok", 0, timeout=30)
    threads = start_sites(server.port, "tok", SITES)
    server.accept_all(20)
    x = np.arange(5, dtype=np.uint64) * np.uint64(2 ** 62)
    replies = server.ask({"x": x})
    assert sorted(replies) == SITES
    assert all(r["twice"].dtype == np.uint64 and np.array_equal(r["twice"], x * np.uint64(2)) for r in replies.values())
    server.close()
    for t in threads:
        t.join(5)
        assert not t.is_alive()


def test_a_wrong_token_or_a_second_connection_for_a_site_is_not_listed():
    server = channel.ChannelServer(SITES, "tok", 0, timeout=30)
    start_sites(server.port, "not-the-token", ["site-1"])
    start_sites(server.port, "tok", ["site-2", "site-3"])
    with pytest.raises(channel.ChannelError, match="site-1: did not connect"):
        server.accept_all(2)
    server.close()


def test_a_site_error_is_named_and_bounded_frames_are_enforced():
    server = channel.ChannelServer(SITES, "tok", 0, timeout=30)

    def fails(req):
        raise ValueError("no such bin")

    start_sites(server.port, "tok", ["site-1", "site-2"])
    start_sites(server.port, "tok", ["site-3"], handle=fails)
    server.accept_all(20)
    with pytest.raises(channel.ChannelError, match="site-3: no such bin"):
        server.ask({"x": np.zeros(1)})
    server.close()
    # a peer announcing a header past the bound is refused before anything is read
    a, b = socket.socketpair()
    conn = channel._Conn(b, "a peer", 5)
    a.sendall(struct.pack("<I", channel.MAX_HEADER + 1))
    with pytest.raises(channel.ChannelError, match="frame header"):
        conn.receive()
    with pytest.raises(channel.ChannelError, match="array"):
        channel.unpack({"v": {"__array__": 0, "dtype": "object", "shape": [1]}}, [b"x"])


@pytest.fixture(scope="module")
def tls_kits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("channel_kits")
    ca, other = make_ca(), make_ca("other")
    server = ServerTLS.from_kit(write_server_kit(tmp / "server", ca))
    clients = {s: ClientTLS.from_kit(write_kit(tmp / s, s, ca)) for s in SITES}
    clients["intruder"] = ClientTLS.from_kit(write_kit(tmp / "intruder", "site-3", other))
    return server, clients


def test_mutual_tls_lists_a_site_only_with_its_own_certificate(tls_kits):
    server_tls, clients = tls_kits
    server = channel.ChannelServer(SITES, "tok", 0, tls=server_tls, timeout=30)
    start_sites(server.port, "tok", SITES, tls_of=lambda s: clients[s])
    server.accept_all(20)
    assert sorted(server.ask({"x": np.ones(2)})) == SITES
    server.close()

    server = channel.ChannelServer(SITES, "tok", 0, tls=server_tls, timeout=30)
    # site-2 claims to be site-3 with its own certificate; an intruder's certificate from another CA says site-3
    start_sites(server.port, "tok", ["site-1"], tls_of=lambda s: clients[s])
    start_sites(server.port, "tok", ["site-2"], tls_of=lambda s: clients[s], claimed={"site-2": "site-3"})
    start_sites(server.port, "tok", ["site-3"], tls_of=lambda s: clients["intruder"])
    with pytest.raises(channel.ChannelError) as err:
        server.accept_all(2)
    assert "site-2" in str(err.value) and "site-3" in str(err.value)
    server.close()
