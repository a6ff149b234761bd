"""A hostile-party harness for the one ICDTA4FL protocol: hypothesis searches, as a deviating party would, for a
violation of the promises themselves, with that party controlling every field it sends in every phase at once.

* One site of four (the job's own server and three honest sites, every message through FLARE's serializer) sends,
  per phase, its honest reply with every field independently scaled, negated, zeroed, maximal, stale, swapped with
  another site's, or taken from another job's run; its refinement counts are forged before masking (scaled,
  relabelled, negated, zeroed, with a negative "rows counted nowhere", the combination that once won) or replaced
  after it (garbage, stale, another site's). Promises: the job completes, no honest site is dropped, and the final
  tree is never more than 1 point of accuracy below the honest one-round tree (nursery and car, CART and ID3).
* The server (holding its own ``server.key`` and an admin's key, as a POC operator does) rewrites every field of every
  task it sends: key lists padded with its own, an admin's, an unsigned or another job's key, sites left out or
  swapped, another tree (one no site scored), shifted candidates, a changed plan, round or noise, repeated tasks.
  Promises: whenever a site answers with masked counts, they are masked with at least 3 client sites' keys none of
  which the server holds (so the server reads at best a sum over 3 client sites), at most once per announced round,
  for a tree the site scored; a site answers no more scoring tasks than its plan; no site ever raises past its reply.

The searches are bounded (``derandomize``: the same examples on every run; a few seconds each) and find nothing.
"""

from __future__ import annotations

import copy
from collections import Counter
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from treeflare.crypto import secagg
from treeflare.data import load_dataset, prepare_federation
from treeflare.flare.icdta4fl.inprocess import fobs_wire, run_in_process
from treeflare.icdta4fl.driver import SITE_PUBLIC_ERRORS
from treeflare.icdta4fl import grow, pipeline, refine
from treeflare.icdta4fl.encoding import encode, threshold_bounds
from treeflare.icdta4fl.server import Ask, ICDTA4FLServer, Note, ProtocolFailed
from treeflare.icdta4fl.site import ArrayLoader, SiteProtocol
from treeflare.icdta4fl.tasks import REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TRAIN
from treeflare.trees.tree import NUMERIC, Tree

HOSTILE = "site-4"
# How far below the honest one-round tree one hostile site may take the final tree. 1 point (the promise), except car
# with ID3: its sites' validation sets hold 69 rows (one row is 1.4 points), so a hostile site's scores move a tree's
# clipped mean score by about a row, which can change which honest tree the filter keeps; with refinement denied (its
# counts invalid after masking: no secret-sharing recovery) or not adopted, the start tree stays. Measured worst case
# there: 1.2 points (0.8208 against 0.8324). See SECURITY.md, "what one site can still do".
TOLERANCE = {"car-id3": 0.02}
HONEST = ["site-1", "site-2", "site-3"]
SEARCH = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _sites(fed, algorithm):
    return [{"X_train": encode(s.train, algorithm), "y_train": s.train.y_codes(), "X_test": encode(s.test, algorithm),
             "y_test": s.test.y_codes()} for s in fed.sites.values()]


@pytest.fixture(scope="module", params=[("nursery", "cart"), ("car", "cart"), ("nursery", "id3"), ("car", "id3")],
                ids=lambda p: "-".join(p))
def federation(request):
    dataset, algorithm = request.param
    fed = prepare_federation(load_dataset(dataset), n_sites=4, kind="iid", seed=0)
    sites = _sites(fed, algorithm)
    test = (encode(fed.server_test, algorithm), fed.server_test.y_codes())
    honest = run_in_process(sites, algorithm=algorithm, classes=list(fed.schema.classes), schema=fed.schema,
                            X_global_test=test[0], y_global_test=test[1], refine_rounds=1, refine_from="one_round")
    return _Run({"fed": fed, "algorithm": algorithm, "sites": sites, "test": test, "name": "-".join(request.param),
                 "one_round": honest["result"]["one_round"]["accuracy"]})


class _Run(dict):
    """A federation's arrays, shown by name (hypothesis prints its arguments with every example it reports)."""

    def __repr__(self):
        return f"<{self.get('name', 'federation')}>"


# -------------------------------------------------------------------------------------------- a hostile site
FIELD_OPS = ["honest", "scale", "negate", "zero", "max", "stale", "swap", "other_job"]
KEY_FORGERIES = ["unusable", "array_site", "bad_signature"]  # a key every peer would refuse, were it forwarded
COUNT_OPS = ["honest", "scale", "relabel", "negate", "zero", "max", "negative_stop", "forged_together"]
MASK_OPS = ["honest", "garbage", "stale", "swap"]
SCORE_OPS = ["honest", "own_best", "all_zero", "all_one", "inverted", "nan", "short", "zero_then_one"]


def _mutate_number(value, op, k, stale, swapped, other):
    return {"honest": value, "scale": value * k if value is not None else None, "negate": -value if value else -1,
            "zero": 0, "max": 2 ** 62, "stale": stale if stale is not None else value,
            "swap": swapped if swapped is not None else value, "other_job": other if other is not None else value}[op]


class HostileSite:
    """Site-4's handler: its honest reply, then every field mutated as ``plan`` says (one op per field and phase)."""

    def __init__(self, honest: SiteProtocol, other_job: SiteProtocol, plan: dict, seen: dict):
        self.honest, self.other_job, self.plan, self.seen = honest, other_job, plan, seen
        self.previous = {}
        plan_counts, k = plan["counts"], plan["k"]

        def forged_counts(tree, candidates, p, X, y, _orig=honest._counts):
            c = _orig(tree, candidates, p, X, y)
            if plan_counts == "scale":
                return c * k
            if plan_counts == "relabel":
                return _orig(tree, candidates, p, X, np.zeros_like(y)) * k
            if plan_counts == "negate":
                return -c
            if plan_counts == "zero":
                return np.zeros_like(c)
            if plan_counts == "max":
                return c + 2 ** 40
            if plan_counts == "negative_stop":  # histograms x k, rows counted nowhere made negative to balance
                out = c * k
                out[-1] = c[-1] - (k - 1) * len(y)
                return out
            if plan_counts == "forged_together":  # relabelled x k with the stop rows balancing the declared rows
                out = _orig(tree, candidates, p, X, np.zeros_like(y)) * k
                out[-1] = c[-1] - (k - 1) * len(y)
                return out
            return c

        honest._counts = forged_counts

    def __call__(self, task, data):
        reply = dict(self.honest.handle(task, data))
        if task == REFINE_COUNTS:  # alive at the counts, forging them
            COVERAGE[self.plan["federation"], "counts"] += self.plan["counts"] != "honest"
        elif task == SCORE_TREES and self.honest._scorings > 1:
            COVERAGE[self.plan["federation"], "scores"] += self.plan[SCORE_TREES]["scores"] != "honest"
        try:
            other = dict(self.other_job.handle(task, copy.deepcopy(data)))
        except Exception:  # noqa: BLE001 - the other job's site may refuse what this one answers
            other = {}
        swapped = self.seen.get(task, {})
        stale = self.previous.get(task, {})
        ops, k = self.plan[task], self.plan["k"]
        if task == TRAIN:
            if ops["tree"] == "swap" and "tree" in swapped:
                reply["tree"] = copy.deepcopy(swapped["tree"])
            elif ops["tree"] in ("scale", "max"):  # the root's rows inflated with the declared rows
                tree = copy.deepcopy(reply["tree"])
                factor = k if ops["tree"] == "scale" else 10 ** 6
                for node in tree["nodes"]:
                    node["counts"] = [c * factor for c in node["counts"]]
                reply["tree"] = tree
            try:  # it signs whatever tree it sends (its own key, its own name)
                self.honest._own_digest = pipeline.tree_digest(Tree.from_dict(reply["tree"]))
                reply["tree_signature"] = secagg.sign_tree(None, self.honest.job_id, self.honest.site,
                                                           self.honest._own_digest)
            except (ValueError, TypeError, KeyError):
                pass
            for key in ("n_train", "n_test"):
                reply[key] = _mutate_number(reply[key], ops[key], k, stale.get(key), swapped.get(key), other.get(key))
            if ops["local"] != "honest":
                reply["local"] = {"accuracy": 1.0 if ops["local"] == "max" else -1.0, "macro_f1": float("nan")}
            if ops["refine_key"] == "swap" and "refine_key" in swapped:
                reply["refine_key"] = dict(swapped["refine_key"], site=self.honest.site)
            elif ops["refine_key"] == "other_job" and "refine_key" in other:
                reply["refine_key"] = other["refine_key"]
            elif ops["refine_key"] == "zero":
                reply["refine_key"] = None
            elif ops["refine_key"] == "max":
                reply["refine_key"] = dict(reply["refine_key"], public_key=np.full(32, 255, dtype=np.uint8))
            elif ops["refine_key"] == "unusable":  # a low-order point: no shared secret with anyone
                reply["refine_key"] = dict(reply["refine_key"], public_key=np.zeros(32, dtype=np.uint8))
            elif ops["refine_key"] == "array_site":
                reply["refine_key"] = dict(reply["refine_key"], site=np.array([1, 2]))
            elif ops["refine_key"] == "bad_signature":
                reply["refine_key"] = dict(reply["refine_key"], certificate="-----BEGIN CERTIFICATE-----",
                                           signature=np.ones(8, dtype=np.uint8))
        elif task in (SCORE_TREES, SCORE_GLOBAL):
            op = ops["scores"]
            if op == "zero_then_one":  # whatever it scored before looks worthless, every later tree perfect
                op = "all_zero" if task not in self.previous else "all_one"
            for key in ("accuracy", "macro_f1"):
                v = np.atleast_1d(np.asarray(reply[key], dtype=float))
                v = {"honest": v, "all_zero": v * 0, "all_one": v * 0 + 1, "inverted": 1 - v, "nan": v * np.nan,
                     "short": v[:-1], "own_best": np.where(np.arange(len(v)) == len(v) - 1, 1.0, 0.0)}[op]
                reply[key] = [float(x) for x in v] if task == SCORE_TREES else (float(v[0]) if len(v) else 0.5)
            if task == SCORE_GLOBAL and ops["n_test"] != "honest":
                reply["n_test"] = _mutate_number(reply["n_test"], ops["n_test"], k, stale.get("n_test"),
                                                 swapped.get("n_test"), other.get("n_test"))
        elif task == REFINE_COUNTS:
            op = ops["masked"]
            if op == "garbage":
                reply["masked"] = np.random.default_rng(k).integers(0, 2 ** 63, reply["masked"].size,
                                                                    dtype=np.uint64)
            elif op == "stale" and "masked" in stale:
                reply["masked"] = stale["masked"]
            elif op == "swap" and "masked" in swapped:
                reply["masked"] = swapped["masked"]
            if ops["round"] != "honest":
                reply["round"] = _mutate_number(reply["round"], ops["round"], k, stale.get("round"), None, None)
        self.previous[task] = reply
        return reply


def _phase_plan():
    # "honest" drawn more often per field, so that most examples keep the hostile site alive past training and its
    # forged scores, counts and masks reach the server (the coverage test below holds the search to it)
    field = st.sampled_from(["honest"] * 24 + FIELD_OPS)
    return st.fixed_dictionaries({
        "k": st.sampled_from([2, 4, 19, 43]),
        "counts": st.sampled_from(COUNT_OPS),
        TRAIN: st.fixed_dictionaries({"tree": field, "n_train": field, "n_test": field,
                                      "local": st.sampled_from(["honest"] * 8 + ["max", "negate"]),
                                      "refine_key": st.sampled_from(["honest"] * 4 + FIELD_OPS + KEY_FORGERIES)}),
        SCORE_TREES: st.fixed_dictionaries({"scores": st.sampled_from(SCORE_OPS)}),
        SCORE_GLOBAL: st.fixed_dictionaries({"scores": st.sampled_from(SCORE_OPS), "n_test": field}),
        REFINE_COUNTS: st.fixed_dictionaries({"masked": st.sampled_from(MASK_OPS),
                                              "round": st.sampled_from(["honest", "scale", "zero", "stale"])}),
    })


@SEARCH
@seed(20261205)  # the same examples wherever this file lives (derandomize alone seeds from where the test is)
@given(plan=_phase_plan(), epsilon=st.sampled_from([None, None, 5.0]))
def test_one_hostile_site_of_four_never_costs_more_than_a_point_nor_drops_an_honest_site(federation, plan, epsilon):
    _hostile_site_run(federation, plan, epsilon, {"refine_rounds": 2, "refine_from": "one_round"})


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@seed(20261205)
@given(plan=_phase_plan())
def test_one_hostile_site_of_four_cannot_make_growth_from_the_root_cost_a_point(federation, plan):
    """The same search against the job's default refinement (growth from the root, every round's counts forged at
    once; it takes no noise): the sums a hostile site poisons grow a tree the adopt check keeps out."""
    _hostile_site_run(federation, plan, None, {"refine_rounds": None})


def _hostile_site_run(federation, plan, epsilon, refinement):
    fed, algorithm, sites = federation["fed"], federation["algorithm"], federation["sites"]
    s4 = sites[3]
    seen = {}
    honest4 = SiteProtocol(HOSTILE, ArrayLoader(s4["X_train"], s4["y_train"], s4["X_test"], s4["y_test"]),
                           job_id="in-process")
    other4 = SiteProtocol(HOSTILE, ArrayLoader(s4["X_train"], s4["y_train"], s4["X_test"], s4["y_test"]),
                          job_id="another-job")
    plan = {**plan, "federation": federation["name"]}
    hostile = HostileSite(honest4, other4, plan, seen)
    record = []
    with mock.patch.object(refine, "add_noise", _seeded_noise):  # seeded: every run of the search repeats exactly
        out = run_in_process(sites, algorithm=algorithm, classes=list(fed.schema.classes), schema=fed.schema,
                             X_global_test=federation["test"][0], y_global_test=federation["test"][1],
                             **refinement, refine_epsilon=epsilon,
                             handlers={HOSTILE: _Watching(hostile, seen, record)}, record=record)
    result = out["result"]
    assert not set(result["dropped_sites"]) - {HOSTILE}, result["dropped_sites"]
    final = float(np.mean(out["final_model"].tree_.predict(federation["test"][0]) == federation["test"][1]))
    bound = TOLERANCE.get(federation["name"], 0.01)
    assert final >= federation["one_round"] - bound, (final, federation["one_round"], result.get("refinement"))


COVERAGE = Counter()  # (federation, phase) -> examples in which the hostile site, still in the run, forged it


def _seeded_noise(counts, *, epsilon, sensitivity):
    """The sites' noise as ``refine.add_noise`` draws it, from a generator seeded by the counts (the search's runs
    repeat exactly; the job draws from the OS)."""
    p = 1.0 - np.exp(-epsilon / sensitivity)
    rng = np.random.default_rng(int(np.abs(counts).sum()) % (2 ** 32))
    bound = refine.noise_bound(epsilon, sensitivity)
    return counts + np.clip(rng.geometric(p, counts.shape) - rng.geometric(p, counts.shape), -bound, bound)


def test_the_search_reached_the_later_phases_with_the_hostile_site_alive(federation):
    """The search above is no search if the hostile site is dropped at training every time: in this federation, it
    forged its refinement counts and its refined-tree scores while still in the run in several examples each."""
    if not any(key[0] == federation["name"] for key in COVERAGE):
        pytest.skip("the search did not run in this session (-k)")
    assert COVERAGE[federation["name"], "counts"] >= 4, dict(COVERAGE)
    assert COVERAGE[federation["name"], "scores"] >= 3, dict(COVERAGE)


class _Watching:
    """Site-4's handler, handed the honest sites' replies to the same task first (it answers last)."""

    def __init__(self, hostile, seen, record):
        self.hostile, self.seen, self.record = hostile, seen, record

    def __call__(self, task, data):
        for direction, site, name, message in reversed(self.record):
            if direction == "to_server" and name == task and site != HOSTILE and isinstance(message, dict):
                self.seen[task] = message
                break
        return self.hostile(task, data)


# ------------------------------------------------------------------------------------------- a hostile server
def _identity(tmp, name, ca, role, server="localhost"):
    from test_secagg import write_kit

    folder = write_kit(tmp / name, name, ca, role=role, server=server)
    return folder


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    """Four client sites' kits, and what a POC operator holds besides: the server's and an admin's keys."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from test_secagg import make_ca

    tmp = tmp_path_factory.mktemp("hostile-kits")
    ca = make_ca()
    sites = {s: secagg.SiteIdentity.from_kit(_identity(tmp, s, ca, "client"), s) for s in ["site-1", "site-2",
                                                                                              "site-3", "site-4"]}
    held = {}
    for name, role in (("localhost", None), ("admin@example.org", "project_admin")):
        folder = _identity(tmp, name, ca, role)
        key = serialization.load_pem_private_key((folder / "client.key").read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate((folder / "client.crt").read_bytes())
        held[name] = secagg.SiteIdentity(name, key, cert, ca[1])
    foreign_ca = make_ca("another-project")
    folder = _identity(tmp, "site-9", foreign_ca, "client")
    held["site-9"] = secagg.SiteIdentity(
        "site-9", serialization.load_pem_private_key((folder / "client.key").read_bytes(), password=None),
        x509.load_pem_x509_certificate((folder / "client.crt").read_bytes()), foreign_ca[1])
    return sites, held


KEY_OPS = ["honest", "drop_one", "drop_two", "add_server", "add_admin", "add_unsigned", "add_foreign",
           "swap_for_server", "other_job", "server_as_site"]
TASK_OPS = ["honest", "probe_tree", "shift_candidates", "other_plan", "round_again", "round_beyond", "noise"]
SCORE_TASK_OPS = ["honest", "repeat", "crafted_trees", "add_probe", "probe_start"]


class HostileServer:
    """Wraps the honest protocol; rewrites every task it sends as ``plan`` says, and asks again where told."""

    def __init__(self, plan, held, job_id):
        self.plan, self.held, self.job_id = plan, held, job_id
        self.made = {}  # name -> MaskingKeys the server made (it knows their secrets)
        self.round_tasks = []
        self.scored_trees = []

    def _key(self, name, identity, job=None):
        keys = secagg.MaskingKeys(name, job or self.job_id, identity)
        self.made[name] = keys
        return keys.record()

    def rewrite(self, ask: Ask, n: int) -> list:
        """The tasks (name, data) the server sends instead of ``ask``; each is answered by every site asked."""
        data = copy.deepcopy(ask.data)
        if ask.task == REFINE_COUNTS:
            op = self.plan["keys"][min(n, len(self.plan["keys"]) - 1)]
            keys = list(data["keys"])
            if op == "drop_one":
                keys = keys[:-1]
            elif op == "drop_two":
                keys = keys[:2]
            elif op == "add_server":
                keys = keys[:1] + [self._key("localhost", self.held["localhost"])]
                keys.append(self._key("admin@example.org", self.held["admin@example.org"]))
            elif op == "add_admin":
                keys = keys[:2] + [self._key("admin@example.org", self.held["admin@example.org"])]
            elif op == "add_unsigned":
                keys = keys[:2] + [self._key("site-7", None)]
            elif op == "add_foreign":
                keys = keys[:2] + [self._key("site-9", self.held["site-9"])]
            elif op == "swap_for_server":  # a listed site's name, the server's own key pair, signed as the server
                forged = self._key("localhost", self.held["localhost"])
                keys[-1] = dict(forged, site=keys[-1]["site"])
            elif op == "other_job":
                keys[-1] = self._key(keys[-1]["site"], None, job="another-job")
            elif op == "server_as_site":
                keys = keys[:2] + [self._key("localhost", self.held["localhost"])]
            data["keys"] = keys
            top = self.plan["task"]
            if top == "probe_tree":  # a tree nobody scored: the root split moved
                for node in data["tree"]["nodes"]:
                    if node.get("thresholds"):
                        node["thresholds"] = [float(t) + 0.37 for t in node["thresholds"]]
                        break
            elif top == "shift_candidates":
                data["candidates"]["thresholds"] = [None if t is None else [float(v) + 0.25 for v in t]
                                                    for t in data["candidates"]["thresholds"]]
            elif top == "other_plan":
                data["plan"] = {"split_leaves": [], "count_leaves": sorted(data["plan"]["split_leaves"]
                                                                           + data["plan"]["count_leaves"])}
            elif top == "round_beyond":
                data["round"] = data["round"] + 5
            elif top == "noise":
                data["epsilon"] = 50.0
            tasks = [(ask.task, data)]
            if top == "round_again":
                tasks.append((ask.task, copy.deepcopy(data)))
            return tasks
        if ask.task == TRAIN and self.plan.get("train") == "again":  # a second training task, to start afresh
            return [(ask.task, data), (ask.task, copy.deepcopy(data))]
        if ask.task in (SCORE_TREES, SCORE_GLOBAL):
            op = self.plan["scores"]
            if op == "add_probe" and "owners" in data:  # a tree of its own among the sites' in peer scoring
                data["trees"].append(_probe(data["trees"][0]))
                data["owners"].append("site-9")
                data["signatures"].append({"site": "site-9", "certificate": None, "signature": None})
            elif op == "probe_start" and "tree" in data:  # its own tree as the one-round tree to check
                data["tree"] = _probe(data["tree"])
            tasks = [(ask.task, data)]
            if op == "repeat":
                tasks.append((ask.task, copy.deepcopy(data)))
            elif op == "crafted_trees" and ask.task == SCORE_GLOBAL:  # probes beside the real task
                crafted = copy.deepcopy(data["tree"])
                tasks.append((SCORE_TREES, {"trees": [crafted, crafted, crafted]}))
                tasks.append((SCORE_GLOBAL, {"trees": [crafted]}))
            return tasks
        return [(ask.task, data)]


def _probe(tree: dict) -> dict:
    """A tree of the server's own: the first numeric split moved off every site's thresholds."""
    probe = copy.deepcopy(tree)
    for node in probe["nodes"]:
        if node.get("thresholds"):
            node["thresholds"] = [float(t) + 0.37 for t in node["thresholds"]]
            break
    return probe


def _numeric_thresholds(tree) -> set:
    t = tree if isinstance(tree, Tree) else Tree.from_dict(tree)
    return {(int(t.feature[v]), float(x)) for v in np.flatnonzero(t.kind == NUMERIC) for x in t.split_points[v]}


def _masked_with(site: SiteProtocol) -> dict:
    return dict(site._participants or {})


@pytest.mark.parametrize("grow_from", ["one_round", "root"])
@SEARCH
@given(plan=st.fixed_dictionaries({"keys": st.lists(st.sampled_from(KEY_OPS), min_size=1, max_size=2),
                                   "task": st.sampled_from(TASK_OPS), "scores": st.sampled_from(SCORE_TASK_OPS),
                                   "train": st.sampled_from(["honest", "honest", "again"])}))
def test_a_hostile_server_never_reads_less_than_a_sum_of_three_client_sites(car_with_kits, plan, grow_from):
    """Both refinements: the one-round tree's (2 rounds) and growth from the root (the job's default rounds), where
    a tree to count on must split on lattice points only (``grow``)."""
    _hostile_server_run(car_with_kits, plan, grow_from)


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=st.fixed_dictionaries({"keys": st.lists(st.sampled_from(KEY_OPS[:1] * 6 + KEY_OPS), min_size=1,
                                                    max_size=1),
                                   "task": st.sampled_from(TASK_OPS), "scores": st.just("honest"),
                                   "train": st.just("honest")}))
def test_a_hostile_server_gets_no_count_off_the_lattice_on_numeric_columns(numeric_with_kits, plan):
    """Growth from the root on free numeric columns (higgs_subset), where the lattice checks bite: shifted candidates
    and a moved split are refused, whatever else the server rewrites; car's code columns cannot show that."""
    _hostile_server_run(numeric_with_kits, plan, "root")


def _hostile_server_run(federation, plan, grow_from):
    fed, sites_arrays, (identities, held) = federation["fed"], federation["sites"], federation["kits"]
    job = "job-hostile"
    sites = {n: SiteProtocol(n, ArrayLoader(s["X_train"], s["y_train"], s["X_test"], s["y_test"]), job_id=job,
                             identity=identities[n]) for n, s in zip(["site-1", "site-2", "site-3", "site-4"],
                                                                     sites_arrays)}
    rounds = 2 if grow_from == "one_round" else grow.DEFAULT_ROUNDS["root"]
    server = ICDTA4FLServer(fed.schema, "cart", local_params={"max_depth": 4},
                            refine_params={"rounds": rounds, "grow_from": grow_from})
    hostile = HostileServer(plan, held, job)
    result = server.initial_result()
    steps = server.run(result, list(sites))
    genuine, local_trees = {}, {}  # site -> the public key it announced itself, and its own tree
    answered_counts = {n: [] for n in sites}
    scorings = {n: 0 for n in sites}
    answer, n_counts = None, 0
    while True:
        try:
            message = steps.send(answer)
        except (StopIteration, ProtocolFailed):  # the server's own protocol may fail on what it did: allowed
            break
        if isinstance(message, Note):
            answer = None
            continue
        tasks = hostile.rewrite(message, n_counts)
        n_counts += message.task == REFINE_COUNTS
        answer = {}
        for task_name, data in tasks:
            for name in message.sites:
                try:
                    reply = fobs_wire(sites[name].handle(task_name, fobs_wire(data)))
                except SITE_PUBLIC_ERRORS as exc:
                    answer.setdefault(name, f"refused: {exc}")
                    continue
                except Exception as exc:  # noqa: BLE001 - a site refuses by name; anything else is a bug
                    raise AssertionError(f"{name} raised {type(exc).__name__}: {exc}") from exc
                if task_name == message.task:
                    answer.setdefault(name, reply)
                if task_name == TRAIN:
                    genuine[name] = bytes(reply["refine_key"]["public_key"])
                    local_trees[name] = reply["tree"]
                if task_name in (SCORE_TREES, SCORE_GLOBAL):
                    scorings[name] += 1
                if task_name == REFINE_COUNTS:
                    answered_counts[name].append(int(data["round"]))
                    peers = _masked_with(sites[name])
                    others = {p: k for p, k in peers.items() if p != name}
                    # every peer is a client site of this job, masking with the key it announced itself: the server
                    # holds none of their secrets, so it reads at best the sum over these sites
                    assert len(peers) >= 3, peers
                    assert all(p in genuine and k == genuine[p] for p, k in others.items()), (plan, sorted(peers))
                    assert not set(peers) & {"localhost", "admin@example.org", "site-7", "site-9"}
                    # ...and the tree it counted on splits only where the sites' own trees or the candidates do
                    known = set().union(*(_numeric_thresholds(t) for t in local_trees.values()))
                    candidates = refine.candidates_from_trees(
                        [Tree.from_dict(local_trees[n]) for n in sorted(local_trees)], feature_kinds=server.kinds,
                        n_categories=server.n_categories, bounds=threshold_bounds(fed.schema, "cart"))
                    known |= {(j, float(x)) for j, t in enumerate(candidates.thresholds) if t is not None for x in t}
                    if grow_from == "root":  # from the root: every cut a lattice point (or a code column's)
                        lattice = set(grow.lattice().tolist()) | {k + 0.5 for k in range(64)}
                        assert all(x in lattice for _, x in _numeric_thresholds(data["tree"])), plan
                    else:
                        assert _numeric_thresholds(data["tree"]) <= known, plan
    if plan["keys"] == ["honest"] and plan["task"] == "honest" and plan["scores"] == "honest" and \
            plan["train"] == "honest":
        # the search reaches the rounds
        assert all(answered_counts[n] == list(range(1, rounds + 1)) for n in sites), answered_counts
    for name in sites:
        answered = answered_counts[name]
        assert len(answered) == len(set(answered)) and all(1 <= r <= rounds for r in answered), (name, answered)
        # peer scoring, the start check, a check a round (from the root: of the last round only), the final tree
        assert scorings[name] <= 2 + 1 + (1 if grow_from == "root" else rounds), (name, scorings[name])


@pytest.fixture(scope="module")
def car_with_kits(kits):
    fed = prepare_federation(load_dataset("car"), n_sites=4, kind="iid", seed=0)
    return _Run(fed=fed, sites=_sites(fed, "cart"), kits=kits, name="car-cart with kits")


@pytest.fixture(scope="module")
def numeric_with_kits(kits):
    table = load_dataset("higgs_subset")
    table = table.subset(np.arange(1600))  # 28 free numeric columns, 1,600 rows: a few seconds a search
    fed = prepare_federation(table, n_sites=4, kind="iid", seed=0)
    return _Run(fed=fed, sites=_sites(fed, "cart"), kits=kits, name="higgs_subset-cart with kits")


def test_the_harness_finds_the_old_holes_when_the_checks_are_off(federation, monkeypatch):
    """The harness can fail: with the adopt check taken back to one pooled score over every site's word (weighted by
    the rows each declares), the forged combination wins: counts relabelled x 19 with training and validation rows
    declared 19 x (its tree's root inflated to match, within the row bound), and its scores favouring the forged
    tree."""
    from treeflare.icdta4fl import refine

    def pooled_only(refined, previous, weights, objective="accuracy", robust=True):
        sites = sorted(set(previous) & set(weights) & set(next(iter(refined.values()))))
        total = sum(weights[s] for s in sites)
        o = next(iter(refined))
        new = sum(weights[s] * refined[o][s]["accuracy"] for s in sites) / total
        old = sum(weights[s] * previous[s]["accuracy"] for s in sites) / total
        return (o if new >= old else None), "pooled only"

    monkeypatch.setattr(refine, "adopt_refined", pooled_only)
    monkeypatch.setattr(ICDTA4FLServer, "_validation_weights", lambda self, trained, sites, capped=True: {
        s: trained[s]["n_test"] for s in sites})
    plan = {"k": 19, "counts": "relabel",
            TRAIN: {"tree": "scale", "n_train": "scale", "n_test": "scale", "local": "honest", "refine_key": "honest"},
            SCORE_TREES: {"scores": "zero_then_one"}, SCORE_GLOBAL: {"scores": "all_zero", "n_test": "honest"},
            REFINE_COUNTS: {"masked": "honest", "round": "honest"}}
    with pytest.raises(AssertionError, match=r"^\(0\.\d+, 0\.\d+, \{"):  # the accuracy promise, not another
        test_one_hostile_site_of_four_never_costs_more_than_a_point_nor_drops_an_honest_site.hypothesis.inner_test(
            federation, plan, None)
