"""The ``direct`` transport of the XGBoost job: what the server tells the sites, checked on arrival, and where a
site finds the server. No NVFlare imports: tested directly.

NVFlare launches and supervises; XGBoost's own federated communicator carries the histograms. The server
sends one ``xgb_direct_train`` task holding the ranks (fixed by the job), the world size, the port of XGBoost's
federated server, whether it speaks TLS, and an optional host override. Each site then connects its XGBoost
straight to ``<server host>:<port>``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ...data.federation import natural_key
from ...xgb.fedserver import MAX_PORT

TRAIN_TASK = "xgb_direct_train"
HEARTBEAT_TOPIC = "treeflare.xgb_direct.heartbeat"  # site -> server, every heartbeat interval while training
SERVER_HOST_ENV = "TREEFLARE_XGB_SERVER_HOST"  # a site's own override of the server's host name
MAX_WORLD = 1024
_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]{1,253})$")


class ProtocolError(ValueError):
    """A task or reply does not say what this side expects; the message names the field."""


def job_ranks(sites: list[str], label_owner: str | None = None) -> dict:
    """Ranks fixed by the job: the label owner (vertical) is rank 0, the others follow in the job's site order.

    The job's order is the federation's (site-1, site-2, ..., site-10): never a string sort, never who
    connects first."""
    if len(set(sites)) != len(sites) or not sites:
        raise ProtocolError(f"sites must be distinct and non-empty, got {sites}")
    order = list(sites)
    if label_owner is not None:
        if label_owner not in order:
            raise ProtocolError(f"label owner {label_owner!r} is not one of the sites {order}")
        order.remove(label_owner)
        order.insert(0, label_owner)
    return {s: i for i, s in enumerate(order)}


def check_ranks(ranks) -> dict:
    """``ranks`` as {site: rank} with ranks exactly 0..n-1."""
    if not isinstance(ranks, dict) or not ranks:
        raise ProtocolError("'ranks' must be a non-empty object {site: rank}")
    if len(ranks) > MAX_WORLD:
        raise ProtocolError(f"'ranks' has {len(ranks)} sites (at most {MAX_WORLD})")
    out = {}
    for site, rank in ranks.items():
        if not isinstance(site, str) or not site:
            raise ProtocolError("'ranks' keys must be site names")
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise ProtocolError(f"'ranks'[{site!r}] must be an integer")
        out[site] = rank
    if sorted(out.values()) != list(range(len(out))):
        raise ProtocolError(f"'ranks' must number the sites 0..{len(out) - 1} once each, got {sorted(out.values())}")
    return out


def check_host(host) -> str:
    if not isinstance(host, str) or (host and not _HOST_RE.match(host)):
        raise ProtocolError(f"server host must be a host name or address, got {str(host)[:80]!r}")
    return host


def train_task_data(ranks: dict, port: int, tls: bool, server_host: str = "") -> dict:
    return {"ranks": check_ranks(ranks), "world_size": len(ranks), "port": int(port), "tls": bool(tls),
            "server_host": check_host(server_host)}


def parse_train_task(data, site: str) -> dict:
    """The train task as this site must see it; raises ProtocolError naming the field."""
    if not isinstance(data, dict):
        raise ProtocolError("the train task is not an object")
    ranks = check_ranks(data.get("ranks"))
    if site not in ranks:
        raise ProtocolError(f"{site} has no rank in this job (ranks are for {sorted(ranks, key=natural_key)})")
    world = data.get("world_size")
    if world != len(ranks):
        raise ProtocolError(f"'world_size' {world!r} does not match the {len(ranks)} ranked sites")
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
        raise ProtocolError(f"'port' must be in 1..{MAX_PORT}, got {port!r}")
    tls = data.get("tls")
    if not isinstance(tls, bool):
        raise ProtocolError("'tls' must be true or false")
    return {"rank": ranks[site], "world_size": world, "port": port, "tls": tls,
            "server_host": check_host(data.get("server_host", "")), "ranks": ranks}


def kit_server_host(startup_dir) -> str | None:
    """The FL server's host name in a site's startup kit (``startup/fed_client.json``), or None."""
    path = Path(startup_dir) / "fed_client.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
        target = cfg["servers"][0]["service"]["target"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise ProtocolError("the site's startup/fed_client.json has no servers[0].service.target") from None
    return check_host(target_host(str(target))) or None


def target_host(target: str) -> str:
    """The host of ``host:port``, ``[v6]:port`` or a bare host."""
    target = target.strip()
    if target.startswith("["):
        return target[: target.index("]") + 1] if "]" in target else target
    return target.split(":", 1)[0] if target.count(":") == 1 else target


def site_server_host(job_host: str, startup_dir, simulate: bool) -> tuple[str, str]:
    """(host, where it came from) for this site's XGBoost: the site's own ``$TREEFLARE_XGB_SERVER_HOST``,
    else the job's ``--xgb-server-host``, else the FL server's host in the site's startup kit; in the simulator
    (every site on the server's machine, no kit) ``localhost``."""
    own = os.environ.get(SERVER_HOST_ENV, "").strip()
    if own:
        return check_host(own), f"${SERVER_HOST_ENV} on the site"
    if job_host:
        return check_host(job_host), "the job's --xgb-server-host"
    kit = kit_server_host(startup_dir) if startup_dir else None
    if kit:
        return kit, "the site's startup kit (startup/fed_client.json)"
    if simulate:
        return "localhost", "the simulator (all sites run on the server's machine)"
    raise ProtocolError("cannot tell the FL server's host name: the site's startup kit has no "
                        f"startup/fed_client.json; set ${SERVER_HOST_ENV} on the site or --xgb-server-host in the job")


def check_site_reply(data, site: str, rank: int) -> dict:
    """A site's successful reply: its rank, timings and model digest, checked against what the server sent."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{site}: reply is not an object")
    if data.get("rank") != rank:
        raise ProtocolError(f"{site}: reply says rank {data.get('rank')!r}, the job gave it {rank}")
    out = {"rank": rank}
    for key in ("load_s", "train_start", "train_end"):
        v = data.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ProtocolError(f"{site}: reply field {key!r} must be a number")
        out[key] = float(v)
    for key in ("rounds", "n_train"):
        v = data.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ProtocolError(f"{site}: reply field {key!r} must be a non-negative integer")
        out[key] = v
    digest = data.get("model_sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ProtocolError(f"{site}: reply field 'model_sha256' must be a sha256 hex digest")
    out["model_sha256"] = digest
    return out


_XGB_NOISE = [re.compile(p) for p in (r"\[\d\d:\d\d:\d\d\]",  # timestamps
                                      r"\S*/\S+\.(?:cc|h|cu|py):\d+:?",  # source paths
                                      r"\[[\w.]+:\d+\|[\d:]+\]:?")]  # [file.cc:NN|time]


def short_error(exc: BaseException, limit: int = 400) -> str:
    """An exception as one line for the server: XGBoost's source paths, timestamps and stack trace removed."""
    text = str(exc).split("Stack trace:", 1)[0]
    for pat in _XGB_NOISE:
        text = pat.sub(" ", text)
    text = re.sub(r"\s*-\s+", " ", text)
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text}"[:limit]
