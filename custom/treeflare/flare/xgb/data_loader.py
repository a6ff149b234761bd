"""The XGBoost data loader of the histogram job: reads this site's training and validation files.

The files are the site's own binding (``local/treeflare_site.json`` in its kit, or ``$TREEFLARE_DATA_ROOT``; see
``site_config``), else ``<folder>/<site>/{train,test}.csv`` (``folder``: a federation written by the data layer,
``write_federation``, or the job's ``--data-root``); ``test`` is the validation data watched every round. ``schema`` is the
shared schema (``Schema.to_dict()``) sent in the job configuration, so every site encodes categorical columns
with the same category list, never from its own values. In vertical mode rows are sorted by the id column, so
row i is the same entity at every party, and only the label owner (rank 0) has labels.

With ``psi`` (every vertical job: the job's PSI phase ran first, ``treeflare.flare.psi``), the site keeps only the
rows of its train and validation files whose ids every party holds: the intersection the PSI phase left in this
site's run folder (``<run dir>/psi/intersection.json``, found from the fl_ctx seen at START_RUN), restricted and
sorted by id (``data.intersection.restrict``), so every party derives the same row order on its own.
"""

from __future__ import annotations

import json
import logging
import os
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.app_opt.xgboost.data_loader import XGBDataLoader

from ...data import DataError, Schema, read_site
from ...data.intersection import read_intersection, restrict
from ...xgb.encoding import dmatrix, table_arrays

from ..psi.protocol import intersection_dir
from ..site_config import load_binding, site_config_dir

KINDS = ("train", "test")  # the site's training rows and its validation rows (XGBoost's eval set)

_log = logging.getLogger(__name__)


class TreeflareXGBDataLoader(XGBDataLoader, FLComponent):
    def __init__(self, folder: str, schema: dict | None = None, vertical: bool = False,
                 timing_dir: str | None = None, binding: str = "", psi: bool = False):
        """
        Args:
            folder: the federation folder (absolute path on the site).
            schema: the shared schema as a dict, read from the site's binding; None reads the federation
                ``<folder>`` with its ``partition.json``.
            vertical: column split; rows are aligned on the id column.
            timing_dir: if set, write ``<timing_dir>/<site>.json`` with data-loading timestamps (benchmarks).
            binding: the name of the site binding to read ("" the default one; see site_config).
            psi: keep only the rows in the intersection the job's PSI phase left in this site's run folder
                (vertical mode; the PSI phase must come first in the job).
        """
        FLComponent.__init__(self)
        self.folder = folder
        self.schema = schema
        self.vertical = vertical
        self.timing_dir = timing_dir
        self.binding = binding
        self.psi = bool(psi)
        self._config_dir = None  # the kit's local/ folder, where the site's binding lives
        self._run_dir = None  # this site's run folder of the job, where the PSI phase left the intersection

    def handle_event(self, event_type: str, fl_ctx):
        if event_type == EventType.START_RUN:  # load_data gets no fl_ctx
            self._config_dir = site_config_dir(fl_ctx)
            self._run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())

    def _tables(self) -> dict:
        """This site's train and validation tables, each with this party's columns of the shared schema."""
        if self.schema is None:  # a federation folder, read with its own partition.json
            site_data = read_site(self.folder, self.client_id, None)
            return {"train": site_data.train, "test": site_data.test}
        schema = Schema.from_dict(self.schema)
        binding = load_binding(self.client_id, None, self.folder, config_dir=self._config_dir, name=self.binding)
        _log.info("%s reads %s and %s (%s)", self.client_id, binding.path("train"), binding.path("test"),
                  binding.source)
        return {which: binding.read(which, schema, self.client_id, own_columns=self.vertical) for which in KINDS}

    def _load(self):
        tables = self._tables()
        if self.psi:
            tables = self._intersected(tables)
        return tuple(table_arrays(tables[which], sort_by_id=self.vertical) for which in KINDS)

    def _intersected(self, tables: dict) -> dict:
        """Each table restricted to the ids of the PSI phase's intersection (sorted by id)."""
        site = self.client_id
        if self._run_dir is None:
            raise DataError(f"{site}: no run folder seen at START_RUN; cannot find the PSI phase's intersection",
                            problem="no run folder (START_RUN not seen)", site=site)
        kept = read_intersection(intersection_dir(self._run_dir), site=site)
        out = {}
        for which in KINDS:
            out[which] = restrict(tables[which], kept.get(which, []), site=site, kind=which)
            if len(out[which]) == 0:  # PSI's min_rows guards training rows; say so if none are left either way
                raise DataError(f"{site}: no {which} rows in the intersection of the parties' ids",
                                problem=f"no {which} rows in the intersection", site=site)
            _log.info("%s keeps %d of its %d %s rows (the parties' intersection)", site, len(out[which]),
                      len(tables[which]), which)
        return out

    def arrays(self):
        """(train, validation) as ``xgb.encoding.Arrays``: what ``--engine treeflare`` reads (no DMatrix)."""
        try:
            return self._load()
        except DataError as exc:  # the full message stays in this site's log, the redacted form goes on
            _log.error("%s: %s", self.client_id, exc)
            raise DataError(exc.redacted(), problem=exc.problem, kind=exc.kind, **exc.location) from None

    def load_data(self):
        import xgboost as xgb

        t0 = time.time()
        try:
            train, valid = self._load()
        except DataError as exc:
            # The full message (cell value, local path) stays in this site's log; what XGBoost and FLARE pass on
            # (to the server, too) is the redacted form.
            _log.error("%s: %s", self.client_id, exc)
            raise DataError(exc.redacted(), problem=exc.problem, kind=exc.kind, **exc.location) from None
        if self.vertical:
            mode = xgb.core.DataSplitMode.COL
            if (train.y is not None) != (self.rank == 0):
                raise RuntimeError(f"{self.client_id}: rank {self.rank} but the label is "
                                   f"{'present' if train.y is not None else 'absent'}; the label owner must be rank 0")
        else:
            mode = xgb.core.DataSplitMode.ROW
        dtrain = dmatrix(train, data_split_mode=mode)
        dvalid = dmatrix(valid, data_split_mode=mode)
        if self.timing_dir:
            os.makedirs(self.timing_dir, exist_ok=True)
            with open(os.path.join(self.timing_dir, f"{self.client_id}.json"), "w") as fh:
                json.dump({"load_start": t0, "load_end": time.time(), "rank": self.rank,
                           "n_train": int(train.X.shape[0]), "n_features": int(train.X.shape[1])}, fh)
        return dtrain, dvalid
