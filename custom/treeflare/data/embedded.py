"""Loaders for the datasets embedded in the repository (``data/<name>/``, gzip, each with SOURCE.md).

Row and class counts are those of each SOURCE.md; tests check them exactly.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from .csv_io import frame_to_table, infer_schema, read_raw
from .errors import DataError
from .schema import Schema
from .table import Table

DATASETS = ("nursery", "car", "adult", "default_credit_card", "higgs_subset")

_NURSERY = ["parents", "has_nurs", "form", "children", "housing", "finance", "social", "health"]
_CAR = ["buying", "maint", "doors", "persons", "lug_boot", "safety"]
# Ordered attributes, lowest first (see each SOURCE.md): car's six are graded scales; nursery's are the UCI
# value lists in their given order, except `form` (family form), whose values name no evident order.
ORDINAL = {
    "car": {
        "buying": ["low", "med", "high", "vhigh"], "maint": ["low", "med", "high", "vhigh"],
        "doors": ["2", "3", "4", "5more"], "persons": ["2", "4", "more"], "lug_boot": ["small", "med", "big"],
        "safety": ["low", "med", "high"],
    },
    "nursery": {
        "parents": ["usual", "pretentious", "great_pret"],
        "has_nurs": ["proper", "less_proper", "improper", "critical", "very_crit"],
        "children": ["1", "2", "3", "more"], "housing": ["convenient", "less_conv", "critical"],
        "finance": ["convenient", "inconv"], "social": ["nonprob", "slightly_prob", "problematic"],
        "health": ["recommended", "priority", "not_recom"],
    },
}
_ADULT = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
          "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country"]
_ADULT_CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                      "native-country"]
# UCI's meanings of X1..X23, so that rules read "PAY_0 > 1.5" rather than "X6 > 1.5".
_CREDIT = (["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE", "PAY_0"] + [f"PAY_{i}" for i in range(2, 7)]
           + [f"BILL_AMT{i}" for i in range(1, 7)] + [f"PAY_AMT{i}" for i in range(1, 7)])
_HIGGS = (["lepton_pt", "lepton_eta", "lepton_phi", "missing_energy_magnitude", "missing_energy_phi"]
          + [f"jet{j}_{v}" for j in range(1, 5) for v in ("pt", "eta", "phi", "btag")]
          + ["m_jj", "m_jjj", "m_lv", "m_jlv", "m_bb", "m_wbb", "m_wwbb"])


REPO_DATA = Path(__file__).resolve().parent / "datasets"  # the embedded datasets, shipped in the package


def data_root() -> Path:
    """``$TREEFLARE_DATA_DIR`` or the package's ``datasets/`` folder."""
    env = os.environ.get("TREEFLARE_DATA_DIR")
    if env:
        return Path(env)
    return REPO_DATA


def _file(name: str, filename: str) -> Path:
    path = data_root() / name / f"{filename}.gz"
    if not path.is_file():
        raise DataError(f"{path}: embedded dataset file not found (the package ships them in "
                        f"{REPO_DATA}; TREEFLARE_DATA_DIR, when set, is read instead)")
    return path


def _raw(name, filename, **kw):
    path = _file(name, filename)
    kw.setdefault("sep", ",")  # the embedded files' own separators are known
    return read_raw(path, opener=lambda: gzip.open(path, "rt", newline=""), **kw), str(path)


def load_dataset(name: str, part: str = "train") -> Table:
    """Load an embedded dataset. ``part="test"`` exists for adult and higgs_subset (their own test files)."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; embedded datasets are {list(DATASETS)} (or use --csv)")
    if part not in ("train", "test"):
        raise DataError(f"part must be 'train' or 'test', got {part!r}")
    if part == "test" and name not in ("adult", "higgs_subset"):
        raise DataError(f"dataset {name!r} has no separate test file")

    if name in ("nursery", "car"):
        cols = (_NURSERY if name == "nursery" else _CAR) + ["class"]
        raw, src = _raw(name, f"{name}.data", header=False, names=cols)
        ordinal = ORDINAL[name]
        schema = infer_schema(raw, label="class", categorical=[c for c in cols[:-1] if c not in ordinal],
                              ordinal=ordinal, file=src)
    elif name == "adult":
        raw, src = _adult_raw(part)
        # Category lists come from the training file, so that train and test share one encoding.
        train_raw = raw if part == "train" else _adult_raw("train")[0]
        schema = infer_schema(train_raw, label="income", categorical=_ADULT_CATEGORICAL, file=src)
    elif name == "default_credit_card":
        raw, src = _raw(name, "default_of_credit_card_clients.csv")
        raw.columns = ["ID"] + _CREDIT + ["default"]
        schema = infer_schema(raw, label="default", id_column="ID", file=src)
    else:  # higgs_subset
        filename = "binary.train" if part == "train" else "binary.test"
        raw, src = _raw(name, filename, sep="\t", header=False, names=["signal"] + _HIGGS)
        schema = Schema(infer_schema(raw, label="signal", file=src).features, "signal", ("0", "1"))
    return frame_to_table(raw, schema, file=src, name=name)


def _adult_raw(part: str):
    filename = "adult.data" if part == "train" else "adult.test"
    raw, src = _raw("adult", filename, header=False, names=_ADULT + ["income"], skipinitialspace=True,
                    skiprows=1 if part == "test" else None)
    raw["income"] = raw["income"].str.rstrip(".")  # adult.test writes "<=50K."
    return raw, src
