"""The in-process driver of the one ICDTA4FL protocol: routes the server protocol's tasks (``server``) to site
protocols (``site``) in this process, as the FLARE controller routes them to executors. Tests and benchmarks run
the job's own code through it; ``treeflare.flare.icdta4fl.inprocess`` adds FLARE's serializer on the way.

A site that raises gets the reply its executor would send (the redacted error, ``data.errors.public_error``, marked
when the site's data is missing or unreadable: ``server.failure_reason``), so every refusal reaches the server's
checks as it would through FLARE.
"""

from __future__ import annotations

from typing import Callable

from ..crypto import secagg
from ..data import Feature, Schema
from ..data.errors import is_site_data_error, public_error
from ..trees.validate import PayloadError
from .server import Ask, ICDTA4FLServer, Note, failure_reason

__all__ = ["drive", "run_protocol", "schema_for_arrays", "SITE_PUBLIC_ERRORS"]

# the errors about what the server sent (they hold no site data), whose text a site's reply carries
SITE_PUBLIC_ERRORS = (PayloadError, secagg.SecAggError)


def drive(steps, send: Callable, note: Callable | None = None, after: Callable | None = None):
    """Run a protocol's ``steps`` (``ICDTA4FLServer.run``) to its end: each ``Ask`` goes to ``send(ask)`` (site ->
    reply or reason), each ``Note`` to ``note(text, phase)``; ``after()`` runs after every step (the FLARE controller
    logs the drops it records). Returns what the protocol returns; ``ProtocolFailed`` passes through."""
    answer = None
    try:
        while True:
            message = steps.send(answer)
            if after is not None:
                after()
            if isinstance(message, Note):
                if note is not None:
                    note(message.text, message.phase)
                answer = None
            else:
                assert isinstance(message, Ask)
                answer = send(message)
    except StopIteration as stop:
        return stop.value
    finally:
        if after is not None:
            after()


def run_protocol(server: ICDTA4FLServer, sites: dict, *, result: dict | None = None, server_test=None,
                 wire: Callable | None = None, record: list | None = None, notes: list | None = None,
                 handlers: dict | None = None, verify: dict | None = None):
    """Run ``server``'s protocol against ``sites`` (name -> ``SiteProtocol``). ``wire(dict) -> dict``: what a message
    becomes on the way (each task and each reply); ``record``: (direction, site, task, message as received);
    ``handlers``: name -> a callable ``(task, data) -> reply`` replacing that site's protocol (a hostile site);
    ``verify``: what the server checks signatures with (``ICDTA4FLServer.run``).
    Returns (result, final model, one-round model); raises ``server.ProtocolFailed``."""
    result = server.initial_result() if result is None else result
    wire = wire or (lambda message: message)

    def send(ask: Ask) -> dict:
        answer = {}
        for site in ask.sites:
            data = wire(ask.data)
            if record is not None:
                record.append(("to_site", site, ask.task, data))
            handle = (handlers or {}).get(site) or sites[site].handle
            try:
                reply = wire(handle(ask.task, data))
            except Exception as exc:  # noqa: BLE001 - as the executor: any failure becomes an error reply
                reply = failure_reason("EXECUTION_EXCEPTION", public_error(exc, passthrough=SITE_PUBLIC_ERRORS),
                                       site_data=is_site_data_error(exc))
            if record is not None:
                record.append(("to_server", site, ask.task, reply))
            answer[site] = reply
        return answer

    def note(text, phase):
        if notes is not None:
            notes.append(text)

    model, one_round = drive(server.run(result, list(sites), server_test=server_test, verify=verify), send, note)
    return result, model, one_round


def schema_for_arrays(*, classes, feature_kinds, feature_names=None, n_categories=None, category_names=None) -> Schema:
    """A schema whose encoding is the given matrix: numeric columns as they are, categorical columns (ID3's kind) as
    codes 0..k-1. For tests and tools that hold encoded arrays rather than tables."""
    names = list(feature_names or [f"x{j}" for j in range(len(feature_kinds))])
    features = []
    for j, kind in enumerate(feature_kinds):
        if kind == "categorical":
            k = int((n_categories or [None] * len(names))[j])
            given = (category_names or [None] * len(names))[j]
            features.append(Feature(names[j], "categorical", tuple(given or [str(c) for c in range(k)])))
        else:
            features.append(Feature(names[j], "numeric", ()))
    return Schema(tuple(features), "label", tuple(str(c) for c in classes))
