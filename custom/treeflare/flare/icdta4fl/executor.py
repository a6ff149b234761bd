"""Site side of ICDTA4FL as an NVFlare executor: routes the tasks to the one site protocol
(``treeflare.icdta4fl.site``: train a local tree, score trees, send masked class counts) and reads the site's data.

Only trees, scores and masked count vectors leave the site, never rows; what the site refuses is the protocol's to
say. Its identity (the startup kit's client certificate) and the run's job id come from the site's own context,
never from a task. Data are read against the schema the server sends, from
the site's own binding (``<site kit>/local/treeflare_site.json``, see ``site_config``), else from
``<data_root>/<site>/`` (train.csv, test.csv as written by ``treeflare prepare``).
"""

from __future__ import annotations

from pathlib import Path

from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...crypto import secagg
from ...data import DataError
from ...icdta4fl.driver import SITE_PUBLIC_ERRORS
from ...icdta4fl.encoding import encode
from ...icdta4fl.site import SiteProtocol
from ...trees.validate import PayloadError
from ..site_config import load_binding
from ..site_executor import SiteExecutor
from .protocol import TASKS, TRAIN

__all__ = ["ICDTA4FLExecutor", "site_identity"]


def site_identity(fl_ctx, site: str):
    """This site's provisioned identity from its startup kit (``client.key``, ``client.crt``, ``rootCA.pem``), or
    None in the simulator, which has no kits (keys are then unauthenticated). Outside the simulator a kit without
    them is an error: a site never announces an unsigned key there."""
    try:
        engine = fl_ctx.get_engine() if fl_ctx is not None else None
    except Exception:  # noqa: BLE001 - no engine (a bare context): no kit, as for the data binding
        engine = None
    startup = None
    if engine is not None:
        try:
            startup = Path(engine.get_workspace().get_startup_kit_dir())
        except Exception:  # noqa: BLE001 - no workspace: no kit
            startup = None
    if startup is not None and all((startup / n).is_file() for n in secagg.KIT_FILES.values()):
        return secagg.SiteIdentity.from_kit(startup, site)
    if engine is not None and not fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
        raise DataError(f"{site}: the startup kit has no {', '.join(secagg.KIT_FILES.values())}: the refinement's "
                        "keys cannot be signed", site=site, problem="startup kit certificates missing")
    return None


class ICDTA4FLExecutor(SiteExecutor):
    PUBLIC_ERRORS = SITE_PUBLIC_ERRORS
    PROTOCOL = SiteProtocol  # the site's side of the protocol (a test's hostile site is a subclass)

    def __init__(self, data_root: str = "", binding: str = ""):
        """``data_root``: folder holding ``<site>/train.csv``; a site's own binding (its
        ``local/treeflare_site.json`` or ``$TREEFLARE_DATA_ROOT``) overrides it. ``binding``: the name of the
        site binding to read instead ("" the default one; see site_config)."""
        super().__init__()
        self.data_root = data_root
        self.binding = binding
        self._protocol = None  # this run's SiteProtocol, made by the training task

    def handlers(self) -> dict:
        return {name: (lambda site, task, fl_ctx, _name=name: self._handle(_name, site, task, fl_ctx))
                for name in TASKS}

    def _handle(self, name: str, site: str, task: Shareable, fl_ctx) -> Shareable:
        if name == TRAIN:
            if self._protocol is not None:
                # a second training task would start the site's plan (its scoring budget, its rounds) afresh
                raise PayloadError("task", "training was already answered in this run")
            self._protocol = self.new_protocol(site, fl_ctx)
        elif self._protocol is None:
            raise DataError(f"{name} asked before training in this run")
        reply_data = self._protocol.handle(name, dict(task))
        if "masked" in reply_data:
            self.log_info(fl_ctx, f"{site} sent masked counts for refinement round {reply_data['round']} to be summed "
                                  f"with {', '.join(self._protocol.participants)} (keys checked: "
                                  f"{reply_data['keys_checked']})")
        reply = make_reply(ReturnCode.OK)
        for key, value in reply_data.items():
            reply[key] = value
        return reply

    def new_protocol(self, site: str, fl_ctx):
        """This run's site protocol: its data from the site's binding, its identity and job id from its own
        context."""
        return self.PROTOCOL(site, lambda schema, algorithm: self._load(site, schema, algorithm, fl_ctx),
                             job_id=_job_id(fl_ctx), identity=site_identity(fl_ctx, site))

    def _load(self, site, schema, algorithm, fl_ctx):
        binding = load_binding(site, fl_ctx, self.data_root, name=self.binding)
        if fl_ctx is not None:
            self.log_info(fl_ctx, f"{site} reads {binding.path('train')} and {binding.path('test')} ({binding.source})")
        if binding.refine_peers is not None:  # the operator's own list of the federation, never the server's word
            self._protocol.allowed_sites = frozenset(binding.refine_peers)
        train = binding.read("train", schema, site)
        test = binding.read("test", schema, site)
        return encode(train, algorithm), train.y_codes(), encode(test, algorithm), test.y_codes()


def _job_id(fl_ctx) -> str:
    """The run's job id, from the site's own context (never from a task): it binds the keys to this run."""
    job_id = fl_ctx.get_job_id() if fl_ctx is not None else None
    if not job_id:
        raise DataError("no job id in this site's context: the refinement's keys cannot be bound to the run")
    return str(job_id)
