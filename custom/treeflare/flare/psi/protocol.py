"""What the PSI phase's server and sites both name: our tasks (and NVFlare's DH-PSI task ``"PSI"`` of ``--psi
nvflare``), where a party keeps its intersection, and the checks of the small dicts our tasks exchange (no NVFlare import here).

* ``TASK_CHECK`` (before any PSI message): request ``{"kinds": [...]}``; reply ``{"rows": {kind: n}}`` -- the site
  read and checked its ids (``data.intersection.check_ids``) or replied an error naming itself, never an id;
* ``TASK_RESULT`` (after DH-PSI): request ``{"kinds": [...]}``; reply ``{"rows_after": {kind: n}, "seconds": s,
  "bytes_sent": b, "bytes_received": b}`` -- what the site kept and what PSI cost it;
* ``ECDH_TOPIC`` (``--psi ecdh``, the default, between check and result; aux messages, not tasks): the relay's
  requests of ``treeflare.psi``, a ``{"request": ...}`` of :mod:`treeflare.psi.session` in, its reply out (sealed
  messages the server cannot open);
* ``TASK_DISCARD`` (when the phase fails after DH-PSI, and between DH-PSI attempts): the site deletes its
  intersection; reply empty;
* ``VERIFY_KEY`` (``--psi nvflare`` only: a field of DH-PSI's own ``PREPARE`` stage): true when the DH-PSI run that starts is the identity
  check of the intersections (``controller`` says why), whose items are :func:`verification_items`.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from ...data.intersection import KINDS
from ...psi.options import METHODS  # --psi: our ECDH-PSI (the default), or NVFlare's DH-PSI

TASK_CHECK = "treeflare_psi_check"
TASK_RESULT = "treeflare_psi_result"
TASK_DISCARD = "treeflare_psi_discard"
ECDH_TOPIC = "treeflare.psi_ecdh"  # an aux message: one request of the ECDH-PSI relay (``treeflare.psi``)
PSI_TASK = "PSI"  # NVFlare's DH-PSI task (PSIConst.TASK), named here so the job needs no NVFlare constant
RESULT_FILE = "psi_result.json"
JOB_NAME = "psi"
FOLDER = "psi"
MAX_ROWS = 10**9  # a count above this is not a count a site could have sent honestly
VERIFY_KEY = "treeflare_psi_verify"
# Items each party puts into the identity check. Parties whose intersections differ share none of them, so the check
# passes only if every one is a Bloom-filter false positive: at the ~1% per item seen with tiny sets, 1e-64.
VERIFY_ITEMS = 32


class PsiProtocolError(ValueError):
    """A PSI message that breaks the protocol (the text names fields, never data)."""


def intersection_dir(run_dir) -> Path:
    """Where a party keeps its intersection: ``<the site's run folder of the job>/psi/`` (``intersection.json``)."""
    return Path(run_dir) / FOLDER


def verification_items(items) -> list[str]:
    """What a party puts into the identity check: ``VERIFY_ITEMS`` strings derived from its whole intersection
    (sorted), equal at two parties exactly when their intersections are. They cross the server only as DH-PSI
    items do, blinded under keys the sites hold; the server never sees them, nor the digest they come from."""
    text = "\n".join(["treeflare.psi.intersection"] + sorted(str(i) for i in items))  # never a bare id's hash
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return [hashlib.sha256(f"treeflare.psi.verify:{j}:{digest}".encode()).hexdigest() for j in range(VERIFY_ITEMS)]


def run_dir_of(fl_ctx) -> Path:
    """The run folder of the job at this participant (server or site), from its FL context."""
    return Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))


def check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"the PSI method must be one of {', '.join(METHODS)}")
    return str(method)


def check_kinds(kinds) -> list[str]:
    """``kinds`` as a list: at least one of ``KINDS``, none twice."""
    if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)) or not kinds:
        raise PsiProtocolError(f"kinds must be a non-empty list of {KINDS}")
    out = [str(k) for k in kinds]
    if any(k not in KINDS for k in out) or len(set(out)) != len(out):
        raise PsiProtocolError(f"kinds must be distinct values of {KINDS}")
    return out


def request(kinds) -> dict:
    return {"kinds": check_kinds(kinds)}


def check_request(data, kinds) -> list[str]:
    """A check/result request as a site reads it: its kinds must be the job's (``kinds``, the site's own config)."""
    if not isinstance(data, dict):
        raise PsiProtocolError("the PSI request is not a dict")
    asked = check_kinds(data.get("kinds"))
    if asked != check_kinds(kinds):
        raise PsiProtocolError("the PSI request asks for other kinds of rows than the job configured at the site")
    return asked


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ROWS:
        raise PsiProtocolError(f"{what} is not a row count")
    return int(value)


def check_counts(counts, kinds, what: str) -> dict[str, int]:
    """``{kind: n}`` for exactly ``kinds``."""
    if not isinstance(counts, dict) or set(counts) != set(kinds):
        raise PsiProtocolError(f"{what} must give a row count for each of {list(kinds)}")
    return {k: _count(counts[k], f"{what}[{k!r}]") for k in kinds}


def check_reply(data, kinds) -> dict[str, int]:
    """A site's reply to ``TASK_CHECK``: its rows per kind."""
    if not isinstance(data, dict):
        raise PsiProtocolError("the check reply is not a dict")
    return check_counts(data.get("rows"), kinds, "rows")


def result_reply(rows_after: dict, seconds: float, bytes_sent: int, bytes_received: int) -> dict:
    return {"rows_after": dict(rows_after), "seconds": float(seconds), "bytes_sent": int(bytes_sent),
            "bytes_received": int(bytes_received)}


def check_result_reply(data, kinds) -> dict:
    """A site's reply to ``TASK_RESULT``: rows kept per kind, PSI seconds and bytes at the site."""
    if not isinstance(data, dict):
        raise PsiProtocolError("the result reply is not a dict")
    rows = check_counts(data.get("rows_after"), kinds, "rows_after")
    seconds = data.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise PsiProtocolError("seconds is not a duration")
    sent, received = data.get("bytes_sent"), data.get("bytes_received")
    for name, value in (("bytes_sent", sent), ("bytes_received", received)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PsiProtocolError(f"{name} is not a byte count")
    return {"rows_after": rows, "seconds": float(seconds), "bytes_sent": int(sent), "bytes_received": int(received)}


# what a party's PSI messages weigh (the site's meter and scripts/bench_psi.py count the same way)
def payload_bytes(value) -> int:
    """The bytes of the PSI messages in ``value`` (bytes and strings, in dicts, lists, sets: the protobufs and
    their keys), not FLARE's framing."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(payload_bytes(v) for v in value)
    return 0


def psi_message_bytes(shareable) -> int:
    if shareable is None:
        return 0
    return sum(payload_bytes(v) for k, v in shareable.items() if str(k).startswith("PSI_"))
