"""Reusable command-line pieces for ``treeflare prepare`` and the job scripts (``jobs/*/job.py``).

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
import contextlib
import csv
import difflib
import functools
import math
import re
import signal
import sys
import threading
import warnings
from pathlib import Path

from .data import DATASETS, PARTITIONS, DataError, DataWarning, Table, load_csv, load_dataset, prepare_federation
from .data.csv_io import check_levels
from .data.partition import check_overlap
from .data.separators import check_separator
from .data.discovery import DEFAULT_MIN_CATEGORY_ROWS
from .icdta4fl.refine_counts import MAX_REFINE_ROUNDS

USAGE_ERROR = 2


# -- parsers -------------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default said once: appended as ``(default: X)`` unless its help already speaks of its default,
    and never for a flag, an unset option or an empty string (which would print ``(default: )``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default is None or default is argparse.SUPPRESS
                or isinstance(default, bool) or default == "" or default == []):
            return text
        return f"{text} (default: %(default)s)".lstrip()


class Parser(argparse.ArgumentParser):
    """argparse with the house rules: defaults said once (:class:`HelpFormatter`), and a mistyped option or choice
    answered in two lines with the nearest valid one, instead of the whole usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def option_names(self) -> list[str]:
        # from the help text: argparse keeps its list of actions private
        return sorted(set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", self.format_help())))

    def error(self, message):
        hint = ""
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            word = unknown.group(1).split("=", 1)[0]
            close = difflib.get_close_matches(word, self.option_names(), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
        print(f"{self.prog}: error: {message}{hint}\n(see `{self.prog} --help` for every option)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


# -- data source ---------------------------------------------------------------------------------
def add_data_args(parser: argparse.ArgumentParser, *, default_dataset: str | None = None):
    """Add ``--dataset NAME | --csv PATH --label COL [--categorical a,b] [--id COL] [--ordinal COL=a<b<c ...]``.

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
    g.add_argument("--ordinal", metavar="COL=a<b<c", action="append", default=None,
                   help="an --csv column whose values are ordered, with its levels lowest first (repeatable); "
                        "trees split it by threshold on that order; a value not listed is an error")
    g.add_argument("--sep", metavar="CHAR", default=None,
                   help="--csv field separator, e.g. ';' or '\\t' (default: detected from the first lines among "
                        "',', ';', tab and '|')")
    parser.set_defaults(_default_dataset=default_dataset)
    return g


def add_schema_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--schema discover|FILE`` and ``--min-category-rows K``: the schema of data only the sites hold."""
    g = parser.add_argument_group("schema of data the sites hold (instead of --dataset/--csv)")
    g.add_argument("--schema", metavar="discover|FILE", default=None,
                   help="discover: the sites describe their bound data and the server merges the descriptions "
                        "(a first small job; the default with --env poc/prod when no --dataset/--csv is given); "
                        "FILE: a reviewed schema.json (treeflare schema writes one). --label, --id, --categorical "
                        "and --ordinal declare what discovery cannot know")
    g.add_argument("--min-category-rows", type=int, default=None, metavar="K",
                   help="--schema discover: a site reports a category value only if K of its rows or more hold it "
                        f"(default {DEFAULT_MIN_CATEGORY_ROWS}; rarer values read as unknown)")


def schema_source(args: argparse.Namespace) -> str:
    """Where a job's schema comes from: "data" (the submitter's --dataset/--csv, or the script's default
    dataset), "discover" (the sites, by a discovery job) or "file" (``--schema FILE``). Raises DataError for a
    combination that cannot be meant."""
    schema = getattr(args, "schema", None)
    has_data = bool(getattr(args, "dataset", None) or getattr(args, "csv", None))
    if schema is not None and not str(schema).strip():
        raise DataError("--schema needs 'discover' or a schema.json file")
    if schema is not None and has_data:
        raise DataError("--schema is for data the sites hold; with --dataset/--csv the schema comes from that data "
                        "(give one or the other)")
    if schema is None:
        schema = "discover" if not has_data and getattr(args, "env", "sim") in ("poc", "prod") else None
        args.schema = schema
    source = "data" if schema is None else "discover" if schema == "discover" else "file"
    if source != "data" and getattr(args, "sep", None) is not None:
        raise DataError("--sep applies only to --csv: each site reads its own files with the separator detected "
                        "in them")
    if source != "discover" and getattr(args, "min_category_rows", None) is not None:
        raise DataError("--min-category-rows applies only to --schema discover")
    if source == "file":
        given = [opt for opt, dest in (("--label", "label"), ("--id", "id"), ("--categorical", "categorical"),
                                       ("--ordinal", "ordinal")) if getattr(args, dest, None)]
        if given:
            raise DataError(f"{', '.join(given)}: --schema {schema} already says it; edit the file instead")
    return source


def parse_categorical(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; a name holding a comma is quoted, as in the CSV header:
    ``'"ü,y",b'`` -> ``["ü,y", "b"]``; None or blank -> ``[]``."""
    if not text:
        return []
    try:
        names = next(csv.reader([text], skipinitialspace=True), [])
    except csv.Error as exc:
        raise DataError(f"--categorical {text!r}: cannot read the list ({exc})") from None
    return [c.strip() for c in names if c.strip()]


def parse_ordinal(specs: list[str] | None) -> dict[str, list[str]]:
    """``["size=S<M<L", "grade = 1 < 2 < 3"]`` -> ``{"size": ["S", "M", "L"], "grade": ["1", "2", "3"]}``."""
    out: dict[str, list[str]] = {}
    for spec in specs or []:
        column, eq, levels = spec.partition("=")
        column = column.strip()
        if not eq or not column:
            raise DataError(f"--ordinal {spec!r}: expected COL=low<...<high, e.g. size=S<M<L")
        if column in out:
            raise DataError(f"--ordinal: column {column!r} is given twice")
        out[column] = list(check_levels(column, [v.strip() for v in levels.split("<")]))
    return out


def load_table(args: argparse.Namespace) -> Table:
    """The :class:`Table` that :func:`add_data_args`' options describe.

    Exactly one of --dataset/--csv (or the parser's ``default_dataset``); --label is required with --csv;
    --label/--categorical/--id/--ordinal only apply to --csv. Raises DataError otherwise.
    """
    dataset, csv = getattr(args, "dataset", None), getattr(args, "csv", None)
    label, categorical, id_column = getattr(args, "label", None), getattr(args, "categorical", None), \
        getattr(args, "id", None)
    ordinal, sep = getattr(args, "ordinal", None), getattr(args, "sep", None)
    if dataset and csv:
        raise DataError("give either --dataset or --csv, not both")
    if not dataset and not csv:
        dataset = getattr(args, "_default_dataset", None)
        if not dataset:
            raise DataError(f"give --dataset NAME (one of {', '.join(DATASETS)}) or --csv PATH --label COL")
    if dataset:
        given = [opt for opt, v in (("--label", label), ("--categorical", categorical), ("--id", id_column),
                                    ("--ordinal", ordinal), ("--sep", sep)) if v]
        if given:
            raise DataError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to --csv; "
                            f"embedded dataset {dataset!r} has its own label and column types")
        return load_dataset(dataset)
    if not label:
        raise DataError(f"--csv {csv}: --label COL is required (the name of the label column)")
    return load_csv(csv, label=label.strip(), categorical=parse_categorical(categorical),
                    id_column=id_column.strip() if id_column else None, ordinal=parse_ordinal(ordinal),
                    sep=check_separator(sep))


# -- partitioning --------------------------------------------------------------------------------
def add_partition_args(parser: argparse.ArgumentParser, *, sites: int = 5, partition: str = "iid",
                       alpha: float = 0.5, seed: int = 0):
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
                                 "columns), site-2.. are passive; all joined on the id column (--id), or on a "
                                 "row_id column of row numbers added when the data has none")
    else:
        parser.set_defaults(vertical=True)
    parser.add_argument("--passive", type=int, default=passive, metavar="P",
                        help=f"number of passive parties in a vertical split (default: {passive})")
    add_overlap_arg(parser)


def add_overlap_arg(parser) -> None:
    """Add ``--overlap F`` (a vertical split whose parties hold different customers); checked by :func:`check_args`."""
    parser.add_argument("--overlap", type=float, default=None, metavar="F",
                        help="vertical split: each party's share of its own training rows that all parties hold, "
                             "in (0, 1] (default 1: every party the same rows); below 1 every party, the label "
                             "party too, also holds rows no other party has, in its own row order, with random "
                             "ids when the data has no id column (docs/data.md)")


def overlap_of(args: argparse.Namespace) -> float:
    """The ``--overlap`` to prepare the data with (1.0 when not given)."""
    overlap = getattr(args, "overlap", None)
    return 1.0 if overlap is None else overlap


def prepare_from_args(table: Table, args: argparse.Namespace):
    """``prepare_federation`` with the options of :func:`add_partition_args` (and :func:`add_vertical_args`)."""
    if getattr(args, "vertical", False):
        return prepare_federation(table, n_sites=args.passive + 1, seed=args.seed, vertical=True,
                                  n_passive=args.passive, overlap=overlap_of(args),
                                  keep_ids=bool(getattr(args, "csv", None)))  # your CSV's ids are yours
    alpha = None if args.partition == "iid" else args.alpha  # iid ignores alpha; don't record it
    return prepare_federation(table, n_sites=args.sites, kind=args.partition, alpha=alpha, seed=args.seed)


# -- argument checks (every job script, before FLARE starts) -------------------------------------------
def _integer(lo: int, hi: int | None = None):
    def ok(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
    return ok, (f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]")


def _number(lo: float, *, above: bool = False, hi: float | None = None):
    def ok(v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (v > lo if above else v >= lo) and (hi is None or v <= hi)
    if hi is not None:
        text = f"in [{lo:g}, {hi:g}]"
    else:
        text = "a positive number" if (above and lo == 0) else f"a number {'>' if above else '>='} {lo:g}"
    return ok, text


def _one_of(*values):
    return (lambda v: v in values), "one of " + ", ".join(values)


# Keyed by argparse ``dest``; a script checks the ones it has. None is allowed where it means "the default".
ARG_RULES = {
    # partition and run
    "sites": _integer(1), "alpha": _number(0, above=True), "seed": _integer(0, 2**32 - 1),
    "passive": _integer(1), "min_clients": _integer(1), "task_timeout": _number(0, above=True),
    "timeout": _number(0, above=True),
    # trees
    "max_depth": _integer(1), "global_max_depth": _integer(1), "max_leaves": _integer(1),
    "criterion": _one_of("gini", "entropy"), "percentile": _number(0, hi=100),
    # boosting (XGBoost, vertical GBDT)
    "rounds": _integer(1), "eta": _number(0, above=True), "nthread": _integer(1),
    "early_stopping_rounds": _integer(0), "trees": _integer(1), "bins": _integer(2, 1024),
    "learning_rate": _number(0, above=True), "reg_lambda": _number(0), "min_child_weight": _number(0),
    "precision": _integer(8, 60), "min_category_rows": _integer(1),
    # ICDTA4FL refinement
    "refine_rounds": _integer(0, MAX_REFINE_ROUNDS), "refine_epsilon": _number(0, above=True),
}
OPTIONAL_ARGS = {"global_max_depth", "max_leaves", "criterion", "trees", "refine_epsilon", "min_category_rows",
                 "min_clients", "refine_rounds"}
OPTION_NAMES = {"reg_lambda": "--lambda"}


def option_name(dest: str) -> str:
    return OPTION_NAMES.get(dest, "--" + dest.replace("_", "-"))


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """The one check of the job scripts' arguments, run before anything is written or FLARE starts.

    Every argument in :data:`ARG_RULES` that ``args`` has is checked, then the ones that depend on each other
    (``--min-clients`` <= ``--sites``). Raises DataError naming the argument (``main_guard`` prints it, exit 2).
    """
    for dest, (ok, requirement) in ARG_RULES.items():
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if value is None and dest in OPTIONAL_ARGS:
            continue
        if not ok(value):
            raise DataError(f"{option_name(dest)} must be {requirement}, got {value!r}")
    label, id_column = getattr(args, "label", None), getattr(args, "id", None)
    if label and id_column and label.strip() == id_column.strip():
        raise DataError(f"--label and --id both name column {label.strip()!r}; an id names a row and is never a "
                        "class: give the label column and the id column each its own")
    sites, min_clients = getattr(args, "sites", None), getattr(args, "min_clients", None)
    if sites is not None and min_clients is not None and min_clients > sites:
        raise DataError(f"--min-clients {min_clients} is more than --sites {sites}: the job could never go on")
    if getattr(args, "refine_from", None) == "root" and getattr(args, "refine_rounds", None) != 0:
        # what the server would refuse when the job starts, said before anything is written (icdta4fl/grow.py)
        from .icdta4fl.grow import MAX_LEAF_BUDGET

        if getattr(args, "refine_rounds", None) == 1:
            raise DataError("--refine-rounds 1 cannot grow from the root (round 1 is the grid round, the last prunes "
                            "to the budget): give 2 or more, 0 for none, or --refine-from one_round")
        if (getattr(args, "max_leaves", None) or 0) > MAX_LEAF_BUDGET:
            raise DataError(f"--max-leaves {args.max_leaves}: growth from the root takes at most {MAX_LEAF_BUDGET} "
                            f"leaves (the sites bound every tree they count on by it); for a larger tree use "
                            f"--refine-from one_round, or --refine-rounds 0 for the paper's method")
        if getattr(args, "refine_epsilon", None) is not None:
            raise DataError("--refine-epsilon: growth from the root takes no noise (it drowns the grid round's "
                            "lattice cells); use it with --refine-from one_round")
    _check_overlap_args(args)
    return args


def _check_overlap_args(args: argparse.Namespace) -> None:
    """``--overlap``: a number in (0, 1], for a vertical split of data this script prepares."""
    overlap = getattr(args, "overlap", None)
    if overlap is None:
        return
    check_overlap(overlap)
    if not (getattr(args, "vertical", False) or getattr(args, "mode", None) == "vertical"):
        raise DataError("--overlap applies only to a vertical split (--vertical, or --mode vertical): horizontal "
                        "sites hold different rows already")
    has_data = bool(getattr(args, "dataset", None) or getattr(args, "csv", None))
    if getattr(args, "schema", None) is not None or (not has_data and getattr(args, "env", "sim") in ("poc", "prod")):
        raise DataError("--overlap splits data this script prepares (--dataset/--csv); the parties' own data "
                        "overlaps as it does")


# -- entry points --------------------------------------------------------------------------------
def main_guard(fn):
    """Decorate a ``main``: DataError (bad data or arguments) and OSError (unreadable/unwritable paths)
    print ``error: <message>`` to stderr and exit with status 2, without a traceback.

    SIGTERM is turned into the same unwinding as Ctrl-C (KeyboardInterrupt), so every ``finally`` runs: the
    runner ends the processes it started and temporary folders are removed; the script then exits with
    128 + the signal's number."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ok = False
        try:
            with warnings.catch_warnings(), interruptible():
                warnings.showwarning = _show_warning
                result = fn(*args, **kwargs)
                ok = True
                return result
        except SystemExit as exc:
            ok = exc.code in (0, None)
            raise
        except DataError as exc:
            _fail(str(exc))
        except OSError as exc:
            detail = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
            _fail(detail)
        except KeyboardInterrupt:
            signum = _INTERRUPT["signal"] or signal.SIGINT
            print(f"error: interrupted ({signal.Signals(signum).name}); the processes this job started were "
                  "ended", file=sys.stderr)
            sys.exit(128 + int(signum))
        finally:
            _forget_created(remove=not ok)

    return wrapper


_CREATED: list[Path] = []


def make_workspace(path) -> Path:
    """``path`` made (with its parents) and returned resolved. A command that then fails (a refused input, an
    error) removes the folders made here again if they are still empty: a refused argument leaves no empty
    workspace behind, and a folder that was there before, or that the run wrote into, is never removed."""
    path = Path(path).resolve()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    _CREATED.extend(reversed(missing))  # shallowest first
    return path


def _forget_created(remove: bool) -> None:
    if remove:
        for folder in reversed(_CREATED):  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()  # an empty folder only
    _CREATED.clear()


_INTERRUPT: dict = {"signal": None}


def interrupted_by() -> int | None:
    """The signal (SIGINT or SIGTERM) that interrupted this script, if any (see :func:`interruptible`)."""
    return _INTERRUPT["signal"]


def _on_signal(signum, frame):
    _INTERRUPT["signal"] = signum
    raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible():
    """SIGINT and SIGTERM raise KeyboardInterrupt (and are remembered, :func:`interrupted_by`) while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _INTERRUPT["signal"] = None
    saved = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, DataWarning):  # meant for the user: no source location
        print(f"warning: {message}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


def _fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)
