"""Site side of schema discovery: describe this site's bound training file, within the site's own limits."""

from __future__ import annotations

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...data import DataError
from ...data.discovery import DEFAULT_MIN_CATEGORY_ROWS, site_min_category_rows, site_profile
from ..site_config import load_binding
from ..site_executor import SiteExecutor
from .protocol import TASK


class SchemaDiscoveryExecutor(SiteExecutor):
    """Site side: reads this site's bound training file (``local/treeflare_site.json``, ``$TREEFLARE_DATA_ROOT``,
    else ``<data_root>/<site>/``) and replies with its profile. The site sets its floor for ``k`` (its binding's
    ``min_category_rows``, default 5): a job may ask for a higher ``k``, never a lower one."""

    def __init__(self, data_root: str = "", binding: str = ""):
        """``binding``: the name of the site binding to read ("" the default one; see site_config)."""
        super().__init__()
        self.data_root = data_root
        self.binding = binding

    def handlers(self) -> dict:
        return {TASK: self._profile}

    def _profile(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        binding = load_binding(site, fl_ctx, self.data_root, name=self.binding)
        self.log_info(fl_ctx, f"{site} describes {binding.path('train')} ({binding.source})")
        reply = make_reply(ReturnCode.OK)
        reply["profile"] = profile_site(binding, site, dict(task.get("request") or {}))
        return reply


def profile_site(binding, site: str, request: dict) -> dict:
    """A site's profile of its training file for the server's ``request`` (label, id_column, categorical,
    ordinal, min_category_rows), bounded by the site's binding: its floor for k, the numeric columns it lets a job
    read as categories, and its label and id columns, which the job's names rename (never pick another column)."""
    label, id_column = request.get("label"), request.get("id_column")
    categorical, ordinal = request.get("categorical") or [], request.get("ordinal") or {}
    if not isinstance(categorical, list) or not all(isinstance(c, str) for c in categorical):
        raise DataError("the request's 'categorical' is not a list of column names",
                        problem="the request's 'categorical' is not a list of column names", site=site)
    if not isinstance(ordinal, dict) or not all(isinstance(c, str) for c in ordinal):
        raise DataError("the request's 'ordinal' does not map column names to levels",
                        problem="the request's 'ordinal' does not map column names to levels", site=site)
    raw = binding.read_raw("train", site, label, id_column)
    # the site's floor, not the job's word, bounds k from below
    k = site_min_category_rows(request.get("min_category_rows", DEFAULT_MIN_CATEGORY_ROWS), binding.min_category_rows)
    return site_profile(raw, label=label or binding.label_column, id_column=id_column or binding.id_column,
                        categorical=categorical, ordinal=ordinal, min_category_rows=k,
                        categorical_allowed=binding.categorical_allowed, file=binding.path("train").name, site=site)
