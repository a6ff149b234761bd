"""The one data layer of the bundle: embedded datasets, your own CSV, partitioners, validation.

    >>> from treeflare.data import load_dataset, prepare_federation
    >>> fed = prepare_federation(load_dataset("nursery"), n_sites=5, kind="label", alpha=0.5, seed=0)
"""

from .csv_io import load_csv, read_site_csv
from .embedded import DATASETS, data_root, load_dataset
from .errors import DataError, DataWarning
from .federation import (Federation, SiteData, prepare_federation, read_partition, read_site, site_name,
                         write_federation)
from .join import join_parties
from .partition import PARTITIONS, iid, label_skew, partition_rows, quantity_skew, stratified_split, vertical_columns
from .schema import Feature, Schema, read_schema_file
from .table import Table

__all__ = [
    "DATASETS", "DataError", "DataWarning", "Feature", "Federation", "PARTITIONS", "Schema", "SiteData", "Table", "data_root",
    "iid", "join_parties", "label_skew", "load_csv", "load_dataset", "partition_rows", "prepare_federation", "quantity_skew",
    "read_partition", "read_schema_file", "read_site", "read_site_csv", "site_name", "stratified_split", "vertical_columns",
    "write_federation",
]
