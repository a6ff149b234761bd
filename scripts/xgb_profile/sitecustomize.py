"""Per-exchange timing probes for the NVFlare XGBoost histogram job (used by ``scripts/bench_xgb.py --profile``).

Put this folder on PYTHONPATH and set TREEFLARE_XGB_PROFILE_DIR: every Python process of the run (simulator
workers included, they inherit the environment) then records, one JSON line per event, in
``$TREEFLARE_XGB_PROFILE_DIR/<pid>.jsonl``:

* ``grpc``  (client): XGBoost's call into the site's local gRPC server, FLARE round trip included;
* ``flare`` (client): the FLARE request/reply to the server (``XGBClientAdaptor._send_request``);
* ``server``(server): the server's handling of one request (``XGBController._process_xgb_request``): the
  local gRPC call to XGBoost's federated server, including the wait for the other ranks' contributions.

Nothing is changed in behaviour; probes only wrap methods with ``time.perf_counter`` (monotonic, per process)
and ``time.time`` (wall clock, comparable across processes).
"""

import json
import os
import time

_DIR = os.environ.get("TREEFLARE_XGB_PROFILE_DIR")


def _install():
    try:
        from nvflare.app_opt.xgboost.histogram_based_v2.adaptors import grpc_client_adaptor as gca
        from nvflare.app_opt.xgboost.histogram_based_v2.adaptors import xgb_adaptor
        from nvflare.app_opt.xgboost.histogram_based_v2 import controller
    except Exception:  # not an XGB process, or nvflare missing
        return
    os.makedirs(_DIR, exist_ok=True)
    out = open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a", buffering=1)

    def record(kind, op, rank, seq, t0, t1, nbytes):
        out.write(json.dumps({"k": kind, "op": op, "rank": rank, "seq": seq, "t0": t0, "dt": t1 - t0,
                              "n": nbytes}) + "\n")

    send = xgb_adaptor.XGBClientAdaptor._send_request

    def _send_request(self, op, req):
        t0 = time.time()
        try:
            return send(self, op, req)
        finally:
            buf = req.get("xgb.send_buf")
            record("flare", op, req.get("xgb.rank"), req.get("xgb.seq"), t0, time.time(), len(buf or b""))

    xgb_adaptor.XGBClientAdaptor._send_request = _send_request

    for name in ("Allgather", "AllgatherV", "Allreduce", "Broadcast"):
        orig = getattr(gca.GrpcClientAdaptor, name)

        def wrapper(self, request, context, _orig=orig, _name=name):
            t0 = time.time()
            try:
                return _orig(self, request, context)
            finally:
                record("grpc", _name, request.rank, request.sequence_number, t0, time.time(),
                       len(request.send_buffer))

        setattr(gca.GrpcClientAdaptor, name, wrapper)

    proc = controller.XGBController._process_xgb_request

    def _process_xgb_request(self, topic, request, fl_ctx):
        t0 = time.time()
        try:
            return proc(self, topic, request, fl_ctx)
        finally:
            record("server", request.get_header("xgb.op"), request.get("xgb.rank"), request.get("xgb.seq"), t0,
                   time.time(), len(request.get("xgb.send_buf") or b""))

    controller.XGBController._process_xgb_request = _process_xgb_request


if _DIR:
    _install()
