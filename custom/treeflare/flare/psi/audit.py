"""A server filter that records every task's data and every result crossing the server (and, from the ECDH-PSI
controller, every aux request and reply it relays: :func:`record_exchange`), for a test or a reviewer to check what
the server sees (``build_psi_job(..., audit=True)``; never part of a production job: it writes the
DH-PSI messages, encrypted under the sites' keys, to the server's run folder).

Each message becomes one line of ``<server run folder>/psi_audit.jsonl``: ``{"chain": "task_data"|"task_result",
"task": name, "leaves": [[path, "bytes", hex] | [path, "str", text] | [path, "num", repr]]}`` -- every field,
recursively (dict keys too), headers included.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
from nvflare.apis.filter import Filter, FilterChainType, FilterContextKey
from nvflare.apis.fl_constant import FLContextKey

AUDIT_FILE = "psi_audit.jsonl"
_LOCK = threading.Lock()


def leaves(value, path: str = "", _seen: set | None = None) -> list:
    """Every bytes (numpy arrays as their bytes), str and number in ``value`` (dicts, their keys, lists, tuples, sets, objects' attributes: the
    peer's FL context a result carries too), with where it is; an object met twice (a cycle) is walked once."""
    seen = set() if _seen is None else _seen
    out = []
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [[path, "bytes", bytes(value).hex()]]
    if isinstance(value, np.ndarray):  # the sealed messages of --psi ecdh (uint8), and any numeric array
        return [[path, "bytes", value.tobytes().hex()]]
    if isinstance(value, str):
        return [[path, "str", value]]
    if isinstance(value, (int, float, bool)) or value is None:
        return [[path, "num", repr(value)]]
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(leaves(k, f"{path}/<key>", seen))
            out.extend(leaves(v, f"{path}/{k}", seen))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, v in enumerate(value):
            out.extend(leaves(v, f"{path}[{i}]", seen))
    else:  # an object FOBS carried (e.g. the peer's FLContext): its type and attributes
        out.append([path, "str", type(value).__name__])
        out.extend(leaves(getattr(value, "__dict__", {}), f"{path}.{type(value).__name__}", seen))
    return out


class MessageRecorder(Filter):
    def process(self, shareable, fl_ctx):
        chain = self.get_prop(FilterContextKey.CHAIN_TYPE) or FilterChainType.TASK_DATA_CHAIN  # set by FLARE
        record = {"chain": str(chain), "task": str(fl_ctx.get_prop(FLContextKey.TASK_NAME)), "time": time.time(),
                  "leaves": leaves(dict(shareable))}
        run_dir = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
        with _LOCK, open(run_dir / AUDIT_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return shareable


def record_exchange(run_dir, label: str, requests: dict, replies: dict) -> None:
    """The ECDH-PSI relay's round as the server saw it (its aux requests and the replies), one line each way, in the
    same format as the filter's records (``chain`` ``aux_request`` / ``aux_reply``)."""
    now = time.time()
    with _LOCK, open(Path(run_dir) / AUDIT_FILE, "a", encoding="utf-8") as fh:
        for chain, messages in (("aux_request", requests), ("aux_reply", replies)):
            record = {"chain": chain, "task": label, "time": now, "leaves": leaves(dict(messages))}
            fh.write(json.dumps(record) + "\n")


def read_audit(run_dir) -> list[dict]:
    path = Path(run_dir) / AUDIT_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []
