"""The XGBoost data loader of the histogram job: reads this site's training and validation files.

The files are the site's own binding (``local/treeflare_site.json`` in its kit, or ``$TREEFLARE_DATA_ROOT``; see
``site_config``), else ``<folder>/<site>/{train,test}.csv`` (``folder``: a federation written by the data layer,
``write_federation``, or the job's ``--data-root``); ``test`` is the validation data watched every round. ``schema`` is the
shared schema (``Schema.to_dict()``) sent in the job configuration, so every site encodes categorical columns
with the same category list, never from its own values. In vertical mode rows are sorted by the id column, so
row i is the same entity at every party, and only the label owner (rank 0) has labels.
"""

from __future__ import annotations

import json
import logging
import os
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.app_opt.xgboost.data_loader import XGBDataLoader

from ...data import DataError, Schema
from ...xgb.encoding import dmatrix, load_site, table_arrays

from ..site_config import load_binding, site_config_dir

_log = logging.getLogger(__name__)


class TreeflareXGBDataLoader(XGBDataLoader, FLComponent):
    def __init__(self, folder: str, schema: dict | None = None, vertical: bool = False,
                 timing_dir: str | None = None, binding: str = ""):
        """
        Args:
            folder: the federation folder (absolute path on the site).
            schema: the shared schema as a dict, read from the site's binding; None reads the federation
                ``<folder>`` with its ``partition.json``.
            vertical: column split; rows are aligned on the id column.
            timing_dir: if set, write ``<timing_dir>/<site>.json`` with data-loading timestamps (benchmarks).
            binding: the name of the site binding to read ("" the default one; see site_config).
        """
        FLComponent.__init__(self)
        self.folder = folder
        self.schema = schema
        self.vertical = vertical
        self.timing_dir = timing_dir
        self.binding = binding
        self._config_dir = None  # the kit's local/ folder, where the site's binding lives

    def handle_event(self, event_type: str, fl_ctx):
        if event_type == EventType.START_RUN:  # load_data gets no fl_ctx
            self._config_dir = site_config_dir(fl_ctx)

    def _load(self):
        if self.schema is None:
            return load_site(self.folder, self.client_id, None, vertical=self.vertical)
        schema = Schema.from_dict(self.schema)
        binding = load_binding(self.client_id, None, self.folder, config_dir=self._config_dir, name=self.binding)
        _log.info("%s reads %s and %s (%s)", self.client_id, binding.path("train"), binding.path("test"),
                  binding.source)
        return tuple(table_arrays(binding.read(which, schema, self.client_id, own_columns=self.vertical),
                                  sort_by_id=self.vertical) for which in ("train", "test"))

    def load_data(self):
        import xgboost as xgb

        t0 = time.time()
        try:
            train, valid = self._load()
        except DataError as exc:
            # The full message (cell value, local path) stays in this site's log; what XGBoost and FLARE pass on
            # (to the server, too) is the redacted form.
            _log.error("%s: %s", self.client_id, exc)
            raise DataError(exc.redacted(), problem=exc.problem, **exc.location) from None
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
