"""The direct XGBoost transport without NVFlare: ranks, task checks, where a site finds the server, the federated
server's lifecycle (always ended, even when its owner is killed), TLS really on, bad ports, unreachable ports, and
no listener or process left by the federated baseline."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from treeflare.flare.xgb.protocol import (SERVER_HOST_ENV, ProtocolError, check_site_reply, job_ranks,
                                                 parse_train_task, short_error, site_server_host, train_task_data)
from treeflare.xgb.fedserver import (ClientTLS, FederatedServer, FederatedServerError, ServerTLS, check_port,
                                     free_port, listening, wait_reachable)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ ranks, payloads
def test_ranks_follow_the_job_not_a_string_sort():
    sites = [f"site-{i}" for i in range(1, 12)]
    ranks = job_ranks(sites)
    assert ranks["site-2"] == 1 and ranks["site-10"] == 9 and ranks["site-11"] == 10
    assert sorted(sites).index("site-10") == 1  # what a string sort would have given it
    vertical = job_ranks(["site-1", "site-2", "site-3"], label_owner="site-3")
    assert vertical == {"site-3": 0, "site-1": 1, "site-2": 2}
    with pytest.raises(ProtocolError, match="label owner"):
        job_ranks(["site-1"], label_owner="site-9")


def test_train_task_is_checked_against_the_site():
    data = train_task_data({"site-1": 0, "site-2": 1}, 8003, True, "fl.example.org")
    assert parse_train_task(data, "site-2")["rank"] == 1
    with pytest.raises(ProtocolError, match="site-3 has no rank"):
        parse_train_task(data, "site-3")
    for field, bad, msg in [("ranks", {"site-1": 0, "site-2": 0}, "0..1"), ("port", 70000, "'port'"),
                            ("port", True, "'port'"), ("tls", "yes", "'tls'"), ("world_size", 3, "world_size"),
                            ("server_host", "evil host; rm", "host name")]:
        with pytest.raises(ProtocolError, match=msg):
            parse_train_task({**data, field: bad}, "site-1")


def test_site_reply_is_checked():
    good = {"rank": 1, "load_s": 0.1, "train_start": 1.0, "train_end": 2.0, "rounds": 3, "n_train": 10,
            "model_sha256": "a" * 64}
    assert check_site_reply(good, "site-2", 1)["rounds"] == 3
    with pytest.raises(ProtocolError, match="rank"):
        check_site_reply(good, "site-2", 0)
    with pytest.raises(ProtocolError, match="model_sha256"):
        check_site_reply({**good, "model_sha256": "x"}, "site-2", 1)
    with pytest.raises(ProtocolError, match="train_end"):
        check_site_reply({**good, "train_end": float("nan")}, "site-2", 1)


def test_server_host_from_site_env_job_kit_or_simulator(tmp_path, monkeypatch):
    monkeypatch.delenv(SERVER_HOST_ENV, raising=False)
    kit = tmp_path / "startup"
    kit.mkdir()
    (kit / "fed_client.json").write_text(json.dumps({"servers": [{"service": {"target": "fl.example.org:8002"}}]}))
    assert site_server_host("", kit, simulate=False) == ("fl.example.org",
                                                         "the site's startup kit (startup/fed_client.json)")
    assert site_server_host("other.example.org", kit, simulate=False)[0] == "other.example.org"
    monkeypatch.setenv(SERVER_HOST_ENV, "10.0.0.7")
    assert site_server_host("other.example.org", kit, simulate=False)[0] == "10.0.0.7"
    monkeypatch.delenv(SERVER_HOST_ENV)
    (kit / "fed_client.json").write_text(json.dumps({"servers": [{"service": {"target": "[fd00::1]:8002"}}]}))
    assert site_server_host("", kit, simulate=False)[0] == "[fd00::1]"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert site_server_host("", empty, simulate=True)[0] == "localhost"
    with pytest.raises(ProtocolError, match="cannot tell the FL server's host"):
        site_server_host("", empty, simulate=False)


def test_xgboost_errors_lose_paths_and_stack_traces():
    exc = RuntimeError("[22:42:47] /__w/xgboost/xgboost/src/collective/result.cc:83: [data.cc:822|22:42:47]:\n\n"
                       "- [federated_coll.cc:20|22:42:47]: Allreduce RPC failed. 14: Socket closed\nStack trace:\n"
                       "  [bt] (0) /home/me/.venv/lib/libxgboost.so(+0x2c1a8c)")
    text = short_error(exc)
    assert "Allreduce RPC failed. 14: Socket closed" in text
    assert "/" not in text.replace("RuntimeError:", "") and "Stack" not in text


# ------------------------------------------------------------------------------------------------ ports
def test_bad_ports_are_clear_errors():
    for bad in (0, -1, 65536, "8003", True):
        with pytest.raises(FederatedServerError, match=r"1\.\.65535"):
            check_port(bad)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(FederatedServerError, match=f"{port} is already in use"):
            check_port(port)
        with pytest.raises(FederatedServerError, match="already in use"):
            FederatedServer(2, port).start()


def test_unreachable_port_names_host_and_port_within_the_timeout():
    port = free_port()
    t = time.monotonic()
    with pytest.raises(FederatedServerError, match=f"site-2 cannot reach .* at 127.0.0.1:{port} within 1 s"):
        wait_reachable("127.0.0.1", port, 1.0, who="site-2")
    assert time.monotonic() - t < 3
    with pytest.raises(FederatedServerError, match="cannot resolve"):
        wait_reachable("no-such-host.invalid", port, 1.0)


# ------------------------------------------------------------------------------------------------ lifecycle
def test_server_listens_then_is_gone_after_stop(tmp_path):
    port = free_port()
    server = FederatedServer(3, port, log_path=tmp_path / "server.log").start()
    pid = server.pid
    assert listening(port) and psutil.pid_exists(pid)
    assert "listening on 0.0.0.0" in server.log_tail()
    assert server.stop() is True and server.stop() is True  # idempotent
    assert not _running(pid)
    assert not listening(port)
    check_port(port)  # free again


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_server_ends_when_its_owner_is_killed(tmp_path):
    """SIGKILL of the process that started the server (no cleanup code runs): the server still ends."""
    port = free_port()
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO / 'custom')!r})
        from treeflare.xgb.fedserver import FederatedServer
        s = FederatedServer(2, {port}).start()
        print(s.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(owner.stdout.readline())
        assert listening(port)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 10
        while (_running(server_pid) or listening(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(server_pid), "the federated server outlived its owner"
        assert not listening(port)
    finally:
        if owner.poll() is None:
            owner.kill()


# ------------------------------------------------------------------------------------------------ TLS
def _make_certs(folder: Path) -> tuple[ServerTLS, ClientTLS]:
    """A root CA, a server certificate for localhost and a client certificate, as provisioning makes them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(name, key, issuer_name, issuer_key, ca=False, san=None):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(name, obj):
        path = folder / name
        if isinstance(obj, x509.Certificate):
            path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return str(path)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-root")])
    ca = cert("test-root", ca_key, ca_name, ca_key, ca=True)
    s_key, c_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_path = write("rootCA.pem", ca)
    server = ServerTLS(key=write("server.key", s_key), cert=write("server.crt", cert("server", s_key, ca_name, ca_key,
                                                                                    san="localhost")), ca=ca_path)
    client = ClientTLS(ca=ca_path, key=write("client.key", c_key),
                       cert=write("client.crt", cert("site-1", c_key, ca_name, ca_key)))
    return server, client


def grpc_ready(port: int, creds=None, timeout: float = 5.0) -> bool:
    """Whether a gRPC channel to localhost:port gets past connection set-up (TLS handshake included)."""
    import grpc

    target = f"localhost:{port}"
    channel = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def test_tls_server_refuses_clients_without_a_certificate(tmp_path):
    import grpc

    server_tls, client_tls = _make_certs(tmp_path)
    port = free_port()
    with FederatedServer(2, port, server_tls, log_path=tmp_path / "server.log") as server:
        assert "Federated server listening" in server.log_tail() and "Insecure" not in server.log_tail()
        ca = Path(client_tls.ca).read_bytes()
        assert not grpc_ready(port, timeout=1), "plain TCP client accepted by a TLS server"
        assert not grpc_ready(port, grpc.ssl_channel_credentials(root_certificates=ca), timeout=1), \
            "client without a certificate accepted"
        assert grpc_ready(port, grpc.ssl_channel_credentials(ca, Path(client_tls.key).read_bytes(),
                                                             Path(client_tls.cert).read_bytes()))
    assert not listening(port)


def test_missing_kit_certificates_name_the_files(tmp_path):
    (tmp_path / "rootCA.pem").write_text("x")
    with pytest.raises(FederatedServerError, match="server.key, server.crt"):
        ServerTLS.from_kit(tmp_path)
    with pytest.raises(FederatedServerError, match="client.key, client.crt"):
        ClientTLS.from_kit(tmp_path)


# ------------------------------------------------------------------------------------------------ baseline leak
def _listening_ports(pids) -> set:
    ports = set()
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            ports.add(c.laddr.port)
    return ports


def test_federated_baseline_leaves_no_listener_or_process(tmp_path):
    from test_xgb_units import small_table
    from treeflare.data import prepare_federation, write_federation
    from treeflare.xgb import baselines, make_params

    write_federation(prepare_federation(small_table(), 3, "iid", seed=0), tmp_path / "fed")
    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    before_ports = _listening_ports({me.pid})
    out = baselines.native_distributed(tmp_path / "fed", make_params(2, max_depth=3), 3, timeout=120,
                                       communicator="federated")
    assert out["metrics"]["auc"] > 0.6
    left = [p for p in me.children(recursive=True) if p.pid not in before_children and p.status() != "zombie"]
    assert not left, f"processes left: {[p.cmdline() for p in left]}"
    mine = {me.pid, *(p.pid for p in me.children(recursive=True))}
    assert _listening_ports(mine) <= before_ports, "a listener outlived the federated baseline"


def test_metrics_are_written_off_the_boosting_loop_in_order_and_all_before_close():
    """The direct executor's metrics callback queues each round and a thread writes it: every round reaches the
    writer, in order, by close(); a writer that fails never fails training; no thread is left behind."""
    import threading

    import numpy as np
    import xgboost as xgb
    from nvflare.app_common.tracking.log_writer import LogWriter
    from nvflare.apis.analytix import AnalyticsDataType, LogWriterName

    from treeflare.flare.xgb.executor import queued_metrics_callback

    class Recorder(LogWriter):
        def __init__(self, fail_at=None):
            super().__init__()
            self.rows, self.fail_at, self.threads = [], fail_at, set()

        def get_writer_name(self):
            return LogWriterName.TORCH_TB

        def write(self, tag, value, data_type, global_step=None, **kwargs):
            self.threads.add(threading.current_thread().name)
            if global_step == self.fail_at:
                raise RuntimeError("writer down")
            self.rows.append((global_step, tag, dict(value), data_type))

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(400, 4)), rng.integers(0, 2, 400)
    dtrain, dvalid = xgb.DMatrix(X[:300], y[:300]), xgb.DMatrix(X[300:], y[300:])
    for fail_at in (None, 3):
        writer = Recorder(fail_at)
        cb = queued_metrics_callback(writer)
        evals = {}
        xgb.train({"objective": "binary:logistic", "eval_metric": "auc", "nthread": 1}, dtrain, 6,
                  evals=[(dvalid, "eval"), (dtrain, "train")], evals_result=evals, callbacks=[cb], verbose_eval=False)
        cb.close()
        expected = [(r, f"{d}_metrics", {"auc": evals[d]["auc"][r]}, AnalyticsDataType.METRICS)
                    for r in range(6) if r != fail_at for d in ("eval", "train")]
        assert writer.rows == expected
        assert writer.threads == {"xgb_metrics_writer"}  # never on the training thread
        assert not cb._thread.is_alive()
    with pytest.raises(ProtocolError, match="LogWriter"):
        queued_metrics_callback(object())


def test_training_errors_reach_the_server_without_cells_or_paths():
    import xgboost as xgb

    from treeflare.data import DataError
    from treeflare.flare.xgb.executor import public_training_error

    secret = "123-45-6789"
    assert public_training_error(ValueError(f"could not convert {secret!r} in /home/me/data.csv")) == \
        "ValueError at the site (details in the site's local log)"
    text = public_training_error(DataError(f"/home/me/data.csv: cell {secret!r} is odd"))
    assert secret not in text and "/home/me" not in text and text.startswith("DataError")
    assert public_training_error(xgb.core.XGBoostError("[12:00:01] federated server gone")) == \
        "XGBoostError: federated server gone"
