"""Site side of the PSI phase: this party's ids, NVFlare's DH-PSI task handler with a meter, and our check/result
tasks.

* :class:`SiteIds` -- NVFlare's local ``PSI`` component: ``load_items()`` gives the ``"<kind>:<id>"`` items of
  this site's ids (read from its binding or the job's data_root, as the vertical executor reads its tables, and
  checked by ``data.intersection.check_ids``); ``save()`` keeps the intersection in the site's run folder
  (``protocol.intersection_dir``), never anywhere else.
* :class:`MeteredDhPSITaskHandler` -- NVFlare's ``DhPSITaskHandler``, counting the seconds this site spends in
  PSI tasks and the bytes of the PSI messages it receives and sends; every DH-PSI run (an attempt, or the identity
  check after one: ``controller``) starts clean at its ``PREPARE`` stage.
* :class:`PsiSiteExecutor` -- our tasks around the protocol (DH-PSI, or ``ecdh_executor``'s ECDH-PSI): the check
  before it (so a duplicate id never reaches
  NVFlare's own uniqueness check, whose error quotes the duplicates), the result after it, and the discard
  when the phase fails after DH-PSI.
"""

from __future__ import annotations

import time

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.app_common.app_constant import PSIConst
from nvflare.app_common.psi.psi_spec import PSI
from nvflare.app_opt.psi.dh_psi.dh_psi_task_handler import DhPSITaskHandler

from ...data import DataError
from ...data.federation import read_partition
from ...data.intersection import INTERSECTION_FILE, check_ids, psi_items, read_intersection, write_intersection
from ..site_config import load_binding
from ..site_executor import SiteExecutor
from .protocol import (TASK_CHECK, TASK_DISCARD, TASK_RESULT, VERIFY_KEY, PsiProtocolError, check_kinds,
                       psi_message_bytes,
                       check_request, intersection_dir, result_reply, run_dir_of, verification_items)

LOCAL_PSI_ID = "treeflare_local_psi"
DH_PSI_ID = "treeflare_dh_psi"


def _id_column(binding, schema: dict | None, site: str) -> str:
    """The job's id column: the schema's, else the site binding's, else the federation's (``partition.json`` of a
    folder ``prepare_data.py`` wrote)."""
    if schema and schema.get("id_column"):
        return str(schema["id_column"])
    if binding.id_column:
        return binding.id_column
    if (binding.data_dir.parent / "partition.json").is_file():
        named = (read_partition(binding.data_dir.parent).get("schema") or {}).get("id_column")
        if named:
            return str(named)
    raise DataError(f"{site}: PSI needs an id column: the job's schema names none, nor does the site's binding "
                    f"({binding.source})", problem="no id column named (job schema or site binding)", site=site)


def site_ids(site: str, kinds, *, data_root: str = "", schema: dict | None = None, binding: str = "",
             fl_ctx=None) -> dict[str, list[str]]:
    """This site's ids of each kind (``train``/``test``/``predict``: its binding's file of that name), checked:
    the file holds the id column, has rows, and no id is blank or repeats (DataError naming site, file, column,
    line; never an id)."""
    bound = load_binding(site, fl_ctx, data_root, name=binding)
    column = _id_column(bound, schema, site)
    out = {}
    for kind in check_kinds(kinds):
        path = bound.path(kind)
        raw = bound.read_raw(kind, site, None, column)
        if column not in raw.columns:
            raise DataError(f"{site}: {path}: no id column {column!r}", problem="the id column is missing",
                            file=path, column=column, site=site)
        ids = [str(v).strip() for v in raw[column].tolist()]
        check_ids(ids, site=site, kind=kind, file=str(path), column=column)
        out[kind] = ids
    return out


class SiteIds(PSI):
    """NVFlare's local PSI component for treeflare: this site's ids in, its intersection kept in its run folder."""

    def __init__(self, kinds=("train", "test"), data_root: str = "", schema: dict | None = None, binding: str = ""):
        super().__init__(psi_writer_id="")
        self.kinds = check_kinds(list(kinds))
        self.data_root = data_root
        self.schema = schema
        self.binding = binding
        self._ids: dict[str, list[str]] | None = None

    def initialize(self, fl_ctx):
        self.fl_ctx = fl_ctx  # no PSIWriter: save() writes the party's own file, in its own format

    def ids(self, fl_ctx=None) -> dict[str, list[str]]:
        """The checked ids per kind (read once per run)."""
        if self._ids is None:
            ctx = fl_ctx or self.fl_ctx
            self._ids = site_ids(ctx.get_identity_name(), self.kinds, data_root=self.data_root, schema=self.schema,
                                 binding=self.binding, fl_ctx=ctx)
        return self._ids

    def load_items(self) -> list[str]:
        return psi_items(self.ids())

    def save(self, intersection):
        # DH-PSI saves every pass's intersection; the last one, the intersection of all parties, stays
        self.intersection = list(intersection)
        site = self.fl_ctx.get_identity_name()
        write_intersection(intersection_dir(run_dir_of(self.fl_ctx)), self.intersection, site=site)

    def kept_items(self, fl_ctx) -> list[str]:
        """The items of the intersection this party keeps (its ``intersection.json``)."""
        site = fl_ctx.get_identity_name()
        return psi_items(read_intersection(intersection_dir(run_dir_of(fl_ctx)), site=site))

    def forget(self, fl_ctx) -> None:
        """Delete what an earlier DH-PSI attempt saved: a new one starts from nothing."""
        self.intersection = None
        delete_intersection(run_dir_of(fl_ctx))


def delete_intersection(run_dir) -> None:
    folder = intersection_dir(run_dir)
    (folder / INTERSECTION_FILE).unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


class MeteredDhPSITaskHandler(DhPSITaskHandler):
    """NVFlare's DH-PSI task handler, metered (seconds in PSI tasks, bytes of PSI messages in and out), and reset
    at each DH-PSI run's ``PREPARE`` stage: NVFlare's handler keeps its last pass's intersection (``intersects``,
    which ``get_items()`` then returns instead of the party's ids), its items and its PSI client and server, so a
    second run in the same job would start from the first one's result. An attempt starts from the party's own ids
    and deletes any intersection an earlier attempt saved; the identity check (``VERIFY_KEY`` set) starts from
    ``protocol.verification_items`` of the intersection this party keeps, and saves nothing."""

    def __init__(self, local_psi_id: str = LOCAL_PSI_ID):
        super().__init__(local_psi_id)
        self.seconds = 0.0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.verifying = False

    def start_run(self, shareable, fl_ctx) -> None:
        self.intersects, self.items, self.psi_client, self.psi_server = None, None, None, None
        self.verifying = shareable.get(VERIFY_KEY) is True
        if self.verifying:
            if not isinstance(self.local_psi_handler, SiteIds):
                raise PsiProtocolError("the identity check of the intersections needs treeflare's PSI component")
            self.items = verification_items(self.local_psi_handler.kept_items(fl_ctx))
        elif isinstance(self.local_psi_handler, SiteIds):
            self.local_psi_handler.forget(fl_ctx)

    def get_items(self):
        # NVFlare's get_items tests ``if not self.intersects``, so after a pass whose intersection is EMPTY it goes on
        # with the party's whole set: the next pass would then compare, and another party learn, ids outside the
        # intersection. Here an empty intersection is one (the server's workflow stops the phase at a zero count).
        if self.intersects is not None:
            self.items = self.intersects
        elif self.items is None:
            self.items = self.local_psi_handler.load_items()  # SiteIds: checked (unique, none blank) before any PSI
        return self.items

    def calculate_intersection(self, shareable: Shareable):
        if not self.verifying:
            return super().calculate_intersection(shareable)
        self.intersects = self.psi_client.get_intersection(shareable.get(PSIConst.RESPONSE_MSG))
        result = Shareable()
        result[PSIConst.ITEMS_SIZE] = len(self.intersects)  # the identity check's result is this count only
        return result

    def execute_task(self, task_name, shareable, fl_ctx, abort_signal):
        start = time.perf_counter()
        try:
            self.bytes_received += psi_message_bytes(shareable)
            if task_name == PSIConst.TASK and shareable.get(PSIConst.TASK_KEY) == PSIConst.TASK_PREPARE:
                self.start_run(shareable, fl_ctx)
            result = super().execute_task(task_name, shareable, fl_ctx, abort_signal)
            self.bytes_sent += psi_message_bytes(result)
            return result
        finally:
            self.seconds += time.perf_counter() - start


class PsiSiteExecutor(SiteExecutor):
    """Our PSI tasks at a site: check (rows per kind, ids checked), result (rows kept, seconds, bytes), discard."""

    PUBLIC_ERRORS = (PsiProtocolError,)

    def __init__(self, local_psi_id: str = LOCAL_PSI_ID, meter_id: str = DH_PSI_ID):
        """``meter_id``: NVFlare's DH-PSI handler (metered), which counts the site's PSI seconds and bytes."""
        super().__init__()
        self.local_psi_id = local_psi_id
        self.meter_id = meter_id

    def handlers(self) -> dict:
        return {TASK_CHECK: self._check, TASK_RESULT: self._result, TASK_DISCARD: self._discard}

    def _local(self, fl_ctx) -> SiteIds:
        comp = fl_ctx.get_engine().get_component(self.local_psi_id)
        if not isinstance(comp, SiteIds):
            raise PsiProtocolError(f"the job has no treeflare PSI component {self.local_psi_id!r} at the site")
        return comp

    def _check(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        comp = self._local(fl_ctx)
        check_request(task.get("request"), comp.kinds)
        rows = {kind: len(ids) for kind, ids in comp.ids(fl_ctx).items()}
        self.log_info(fl_ctx, f"{site}: ids checked for PSI: {rows}")
        reply = make_reply(ReturnCode.OK)
        reply["reply"] = {"rows": rows}
        return reply

    def _result(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        comp = self._local(fl_ctx)
        kinds = check_request(task.get("request"), comp.kinds)
        kept = read_intersection(intersection_dir(run_dir_of(fl_ctx)), site=site)
        own = comp.ids(fl_ctx)
        for kind, ids in kept.items():
            if kind not in kinds or not set(ids) <= set(own[kind]):
                raise DataError(f"{site}: its intersection names {kind} ids it does not hold",
                                problem="the intersection names ids the party does not hold", site=site)
        meter = self.meter(fl_ctx)
        reply = make_reply(ReturnCode.OK)
        reply["reply"] = result_reply({k: len(kept.get(k, [])) for k in kinds},
                                      meter.seconds if meter else 0.0, meter.bytes_sent if meter else 0,
                                      meter.bytes_received if meter else 0)
        return reply

    def meter(self, fl_ctx):
        """What counts this site's PSI seconds and bytes (None: nothing does)."""
        handler = fl_ctx.get_engine().get_component(self.meter_id)
        return handler if isinstance(handler, MeteredDhPSITaskHandler) else None

    def _discard(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        delete_intersection(run_dir_of(fl_ctx))
        self.log_info(fl_ctx, f"{site}: a PSI attempt or the phase failed; its intersection is deleted")
        return make_reply(ReturnCode.OK)
