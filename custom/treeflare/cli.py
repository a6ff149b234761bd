"""Reusable command-line pieces for ``scripts/prepare_data.py`` and the job scripts (``jobs/*/job.py``).

Each function stands alone; a script picks the ones it needs::

    import argparse
    from treeflare.cli import add_data_args, add_partition_args, load_table, main_guard, prepare_from_args

    @main_guard
    def main(argv=None):
        parser = argparse.ArgumentParser()
        add_data_args(parser, default_dataset="nursery")
        add_partition_args(parser)
        args = parser.parse_args(argv)
        fed = prepare_from_args(load_table(args), args)
        ...

    if __name__ == "__main__":
        main()

Bad input surfaces as :class:`treeflare.data.DataError`; :func:`main_guard` prints it as
``error: <message>`` on stderr and exits with status 2 (argparse's own status for usage errors).
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings

from .data import DATASETS, PARTITIONS, DataError, DataWarning, Table, load_csv, load_dataset, prepare_federation

USAGE_ERROR = 2


# -- data source ---------------------------------------------------------------------------------
def add_data_args(parser: argparse.ArgumentParser, *, default_dataset: str | None = None) -> argparse._ArgumentGroup:
    """Add ``--dataset NAME | --csv PATH --label COL [--categorical a,b] [--id COL]``.

    ``default_dataset`` is used when neither --dataset nor --csv is given (None: one is required).
    Validation of the combination happens in :func:`load_table`.
    """
    g = parser.add_argument_group("data (an embedded dataset, or your own CSV)")
    g.add_argument("--dataset", metavar="NAME", default=None,
                   help=f"embedded dataset: {', '.join(DATASETS)}"
                        + (f" (default: {default_dataset})" if default_dataset else ""))
    g.add_argument("--csv", metavar="PATH", default=None,
                   help="your own CSV file with a header row (instead of --dataset)")
    g.add_argument("--label", metavar="COL", default=None, help="label column of --csv (required with --csv)")
    g.add_argument("--categorical", metavar="A,B,...", default=None,
                   help="comma-separated --csv columns to treat as categorical (other types are inferred)")
    g.add_argument("--id", metavar="COL", default=None, dest="id",
                   help="--csv column of unique row ids (needed to join vertical parties); not a feature")
    parser.set_defaults(_default_dataset=default_dataset)
    return g


def parse_categorical(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None or blank -> ``[]``."""
    if not text:
        return []
    return [c.strip() for c in text.split(",") if c.strip()]


def load_table(args: argparse.Namespace) -> Table:
    """The :class:`Table` that :func:`add_data_args`' options describe.

    Exactly one of --dataset/--csv (or the parser's ``default_dataset``); --label is required with --csv;
    --label/--categorical/--id only apply to --csv. Raises DataError otherwise.
    """
    dataset, csv = getattr(args, "dataset", None), getattr(args, "csv", None)
    label, categorical, id_column = getattr(args, "label", None), getattr(args, "categorical", None), \
        getattr(args, "id", None)
    if dataset and csv:
        raise DataError("give either --dataset or --csv, not both")
    if not dataset and not csv:
        dataset = getattr(args, "_default_dataset", None)
        if not dataset:
            raise DataError(f"give --dataset NAME (one of {', '.join(DATASETS)}) or --csv PATH --label COL")
    if dataset:
        given = [opt for opt, v in (("--label", label), ("--categorical", categorical), ("--id", id_column)) if v]
        if given:
            raise DataError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to --csv; "
                            f"embedded dataset {dataset!r} has its own label and column types")
        return load_dataset(dataset)
    if not label:
        raise DataError(f"--csv {csv}: --label COL is required (the name of the label column)")
    return load_csv(csv, label=label.strip(), categorical=parse_categorical(categorical),
                    id_column=id_column.strip() if id_column else None)


# -- partitioning --------------------------------------------------------------------------------
def add_partition_args(parser: argparse.ArgumentParser, *, sites: int = 5, partition: str = "iid",
                       alpha: float = 0.5, seed: int = 0) -> argparse._ArgumentGroup:
    """Add ``--sites K --partition iid|quantity|label --alpha A --seed S`` (keyword args set the defaults).

    Values are checked by the data layer (``prepare_federation``), which raises DataError.
    """
    g = parser.add_argument_group("partition among sites")
    g.add_argument("--sites", type=int, default=sites, metavar="K", help=f"number of sites (default: {sites})")
    g.add_argument("--partition", default=partition, choices=PARTITIONS,
                   help="iid: equal random shards; quantity: site sizes ~ Dirichlet(alpha); "
                        f"label: each class spread over sites ~ Dirichlet(alpha) (default: {partition})")
    g.add_argument("--alpha", type=float, default=alpha, metavar="A",
                   help=f"Dirichlet concentration, > 0; smaller is more skewed (default: {alpha})")
    g.add_argument("--seed", type=int, default=seed, metavar="S", help=f"random seed (default: {seed})")
    return g


def add_vertical_args(parser: argparse.ArgumentParser, *, flag: bool = True, passive: int = 1) -> None:
    """Add ``--passive P`` (and ``--vertical`` unless ``flag=False``, for scripts that are always vertical)."""
    if flag:
        parser.add_argument("--vertical", action="store_true",
                            help="split columns instead of rows: site-1 is the active party (label + some "
                                 "columns), site-2.. are passive; needs an id column (--id)")
    else:
        parser.set_defaults(vertical=True)
    parser.add_argument("--passive", type=int, default=passive, metavar="P",
                        help=f"number of passive parties in a vertical split (default: {passive})")


def prepare_from_args(table: Table, args: argparse.Namespace):
    """``prepare_federation`` with the options of :func:`add_partition_args` (and :func:`add_vertical_args`)."""
    if getattr(args, "vertical", False):
        return prepare_federation(table, n_sites=args.passive + 1, seed=args.seed, vertical=True,
                                  n_passive=args.passive)
    alpha = None if args.partition == "iid" else args.alpha  # iid ignores alpha; don't record it
    return prepare_federation(table, n_sites=args.sites, kind=args.partition, alpha=alpha, seed=args.seed)


# -- entry points --------------------------------------------------------------------------------
def main_guard(fn):
    """Decorate a ``main``: DataError (bad data or arguments) and OSError (unreadable/unwritable paths)
    print ``error: <message>`` to stderr and exit with status 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return fn(*args, **kwargs)
        except DataError as exc:
            _fail(str(exc))
        except OSError as exc:
            detail = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
            _fail(detail)

    return wrapper


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, DataWarning):  # meant for the user: no source location
        print(f"warning: {message}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


def _fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)
