"""The two holes found on the landed refinement, tried again through the job's own controller and executors (every
message through FLARE's serializer), and the checks that close them, each tried directly.

1. A deviating server lists a victim beside its own certificate and an admin's (kits from NVFlare's provisioner):
   the victim refuses, naming the role, and sends nothing.
2. One site forges its counts, its rows and its validation weight together, and scores the forged tree perfect: with
   rows within the bound it passes every check on the sum, and the adopt check (each site's change of score
   clipped to the others' range) keeps it out; with rows beyond the bound it is dropped at training.
"""

from __future__ import annotations

import numpy as np
import pytest

from icdta4fl_inprocess import InProcessRun
from test_secagg_roles import SERVER, SITES, _holder, prod  # noqa: F401 - prod is the kits fixture
from treeflare.crypto import secagg
from treeflare.data import Feature, Schema, load_dataset, prepare_federation, write_federation
from treeflare.flare.icdta4fl.controller import ICDTA4FLController
from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
from treeflare.flare.icdta4fl.inprocess import run_in_process
from treeflare.icdta4fl import pipeline, refine
from treeflare.icdta4fl.server import Ask, ICDTA4FLServer, _RoundFailed
from treeflare.icdta4fl.site import SiteProtocol
from treeflare.icdta4fl.tasks import REFINE_COUNTS
from treeflare.trees.tree import Tree


def _controller(fed, root, **kw):
    return ICDTA4FLController(schema=fed.schema.to_dict(), algorithm="cart", local_params={"max_depth": 4},
                              min_clients=2, server_test=str(root / "server" / "test.csv"), **kw)


@pytest.fixture(scope="module")
def car(tmp_path_factory):
    fed = prepare_federation(load_dataset("car"), n_sites=4, kind="iid", seed=0)
    return fed, write_federation(fed, tmp_path_factory.mktemp("car") / "data")


@pytest.fixture(scope="module")
def nursery(tmp_path_factory):
    fed = prepare_federation(load_dataset("nursery"), n_sites=4, kind="iid", seed=0)
    root = write_federation(fed, tmp_path_factory.mktemp("nursery") / "data")
    honest = InProcessRun(root, fed.site_names).run(_controller(fed, root), tmp_path_factory.mktemp("honest"))
    assert honest["status"] == "completed" and honest["refinement"]["status"] == "completed"
    return fed, root, honest


# ----------------------------------------------------------------------------------------- 1. the server's kits
@pytest.mark.parametrize("intruders", [(SERVER, "admin@example.org"), (SERVER,), ("lead@org2.example",)],
                         ids=["server+admin", "server", "lead"])
def test_a_server_listing_its_own_and_an_admins_certificate_unmasks_nobody(prod, car, tmp_path, intruders):  # noqa: F811
    """Kits from NVFlare's provisioner; the server holds ``server.key`` and (as in POC) the admins' kits. It lists
    site-1 beside identities it holds, with X25519 keys it made, validly signed: site-1 refuses, naming the role."""
    fed, root = car
    kits = {s: prod / s / "startup" for s in SITES}
    root_ca = secagg.SiteIdentity.from_kit(kits["site-1"], "site-1").root_ca
    files = {SERVER: ("server.crt", "server.key")}

    class Listing(ICDTA4FLServer):
        answers = []

        def _count_round(self, result, r, tree, candidates, plan, contributors, records, trained):
            forged = [secagg.MaskingKeys(n, "job", _holder(prod, n, *files.get(n, ("client.crt", "client.key")),
                                                           root_ca)).record() for n in intruders]
            keys = [records["site-1"], *([records["site-2"]] if len(intruders) == 1 else []), *forged]
            task = {"tree": tree.to_dict(), "candidates": candidates.to_dict(), "plan": plan.to_dict(), "round": r,
                    "epsilon": None, "keys": keys}
            replies = yield Ask(REFINE_COUNTS, task, ("site-1",), "masked counts")
            self.answers.append(replies["site-1"])
            raise _RoundFailed("the victim's answer is recorded")

    controller = _controller(fed, root)
    controller.protocol = Listing(fed.schema, "cart", local_params={"max_depth": 4}, min_clients=2)
    run = InProcessRun(root, fed.site_names, kits=kits)
    result = run.run(controller, tmp_path / "run")
    assert result["status"] == "completed", result.get("error")
    answer = Listing.answers[-1]
    assert isinstance(answer, str), "the victim sent masked counts"
    role = {SERVER: "is the server's", "admin@example.org": "role is 'project_admin'", "lead@org2.example":
            "role is 'lead'"}[intruders[0]]
    assert f"key of {intruders[0]}: the certificate" in answer and role in answer, answer
    assert result["refinement"]["key_authentication"].startswith("certificates"), result["refinement"]
    assert not [m for d, s, n, m in run.messages if d == "to_server" and n == REFINE_COUNTS and "masked" in m]


# ------------------------------------------------------------------------------------ 2. one site, every field
def _forger(factor):
    class Forger(SiteProtocol):
        """Rows, tree root, validation rows x ``factor``; counts relabelled to class 0 x ``factor`` (so the sum holds
        exactly the declared rows); every tree scored 0 in peer scoring and the start check, every later one 1."""

        def _train(self, task):
            reply = super()._train(task)
            for node in reply["tree"]["nodes"]:
                node["counts"] = [c * factor for c in node["counts"]]
            reply["n_train"] *= factor
            reply["n_test"] *= factor
            self._own_digest = pipeline.tree_digest(Tree.from_dict(reply["tree"]))  # it signs what it sends
            reply["tree_signature"] = secagg.sign_tree(self.identity, self.job_id, self.site, self._own_digest)
            return reply

        def _counts(self, tree, candidates, plan, X, y):
            return super()._counts(tree, candidates, plan, X, np.zeros_like(y)) * factor

        def _score_trees(self, task):
            first = self._peer_trees is None
            reply = super()._score_trees(task)
            value = 0.0 if first else 1.0
            return {k: [value] * len(v) for k, v in reply.items()}

        def _score_global(self, task):
            return {**super()._score_global(task), "accuracy": 0.0, "macro_f1": 0.0}

    return type("ForgingExecutor", (ICDTA4FLExecutor,), {"PROTOCOL": Forger})


@pytest.mark.parametrize("factor, ratio", [(19, None), (43, None), (43, 20)], ids=["x19", "x43", "x43-ratio-20"])
def test_one_site_forging_counts_rows_and_validation_weight_together_does_not_win(nursery, tmp_path, factor, ratio):
    """The attack that once took nursery from 0.910 to 0.333. Within the row bound (x19, and x43 under the default
    bound of 100 x the sites' median) its sum passes every check, and the adopt check, site-4's word clipped to the
    others' range, refuses the tree; with `--max-rows-ratio 20`, x43 is dropped at training by the row bound."""
    fed, root, honest = nursery
    executor = _forger(factor)(data_root=str(root))
    controller = _controller(fed, root, **({"max_rows_ratio": ratio} if ratio else {}))
    result = InProcessRun(root, fed.site_names, executors={"site-4": executor}).run(controller, tmp_path / "run")
    assert result["status"] == "completed", result.get("error")
    assert set(result["dropped_sites"]) <= {"site-4"}
    assert result["global"]["accuracy"] >= honest["one_round"]["accuracy"] - 0.01, result["global"]
    info = result["refinement"]
    if ratio is None:
        assert "site-4" not in result["dropped_sites"] and info["rounds_done"] == 0, info
        why = info["adoption"][0]["why"]
        clipped = why.split("clipped to the others' range")[1].split("clipped)")[0]
        assert not info["adoption"][0]["adopted"] and "site-4" in clipped, why
    else:
        assert "n_train: " in result["dropped_sites"]["site-4"] and "max_rows_ratio" in result["dropped_sites"]["site-4"]
        assert info["status"] == "completed"  # the three others refine without it


# ------------------------------------------------------------------------------------------- the checks, directly
def test_declared_rows_are_bounded_by_the_sites_median():
    """Training rows above 20 x the median of every site's drop the site; validation rows are capped at the median
    in the adopt check's weights, never dropped for; one site moves that median only between the others' values."""
    server = ICDTA4FLServer(Schema((Feature("x", "numeric", ()),), "y", ("a", "b")), max_rows_ratio=20)
    trained = {f"site-{i}": {"n_train": n, "n_test": 100} for i, n in enumerate([1000, 1200, 900, 19_999], start=1)}
    result = {"dropped_sites": {}}
    assert set(server._bound_rows(result, trained)) == set(trained) and not result["dropped_sites"]
    trained["site-4"] = {"n_train": 22_001, "n_test": 100}  # the sites' median is 1,100
    kept = server._bound_rows(result, trained)
    assert "site-4" not in kept and result["dropped_sites"]["site-4"].startswith(
        "icdta4fl_train: n_train: 22001 declared rows, more than 22000")
    # three sites, one honest site 15 x another: kept (the median is the middle site's, not the small one's)
    three = {"site-1": {"n_train": 1500, "n_test": 10}, "site-2": {"n_train": 100, "n_test": 10},
             "site-3": {"n_train": 1000, "n_test": 10}}
    assert set(server._bound_rows({"dropped_sites": {}}, three)) == set(three)
    trained["site-4"] = {"n_train": 1000, "n_test": 2 ** 31}  # a validation weight of 2^31 rows: capped, kept
    assert "site-4" in server._bound_rows({"dropped_sites": {}}, trained)
    assert server._validation_weights(trained, list(trained))["site-4"] == 100
    for bad in (0.5, float("inf"), True):
        with pytest.raises(ValueError, match="max_rows_ratio"):
            ICDTA4FLServer(server.schema, max_rows_ratio=bad)


def _sites(fed):
    from treeflare.icdta4fl.encoding import encode

    return [{"X_train": encode(s.train, "cart"), "y_train": s.train.y_codes(), "X_test": encode(s.test, "cart"),
             "y_test": s.test.y_codes()} for s in fed.sites.values()]


def test_a_site_announcing_another_sites_key_keeps_both_out_and_drops_nobody(car):
    fed, _ = car
    record = []

    def copying(task, data, _site=SiteProtocol("site-4", None, job_id="in-process")):
        from treeflare.icdta4fl.site import ArrayLoader

        if _site.load is None:
            s = _sites(fed)[3]
            _site.load = ArrayLoader(s["X_train"], s["y_train"], s["X_test"], s["y_test"])
        reply = _site.handle(task, data)
        if "refine_key" in reply:
            first = next(m for d, s, n, m in record if d == "to_server" and s == "site-1" and n == task)
            reply["refine_key"] = dict(reply["refine_key"], public_key=first["refine_key"]["public_key"])
        return reply

    out = run_in_process(_sites(fed), algorithm="cart", classes=list(fed.schema.classes), schema=fed.schema,
                         refine_rounds=1, refine_from="one_round", handlers={"site-4": copying}, record=record)
    info = out["result"]["refinement"]
    assert info["excluded_sites"] == {"site-1": "announces the same public key as site-4",
                                      "site-4": "announces the same public key as site-1"}, info
    assert info["status"].startswith("skipped: 2 sites") and not out["result"]["dropped_sites"]


def test_a_class_only_one_site_holds_is_that_sites_count_in_the_sum():
    """What the sum still reveals (SECURITY.md): where only one site holds a class, the sum's counts of that class
    are that site's own, cell by cell."""
    rng = np.random.default_rng(3)
    sites = []
    for i in range(4):
        X = rng.normal(size=(300, 3))
        y = (X[:, 0] > 0).astype(np.int64)
        if i == 0:
            y[X[:, 1] > 1.0] = 2  # class "c": at site-1 alone
        sites.append({"X_train": X[:240], "y_train": y[:240], "X_test": X[240:], "y_test": y[240:]})
    record = []
    out = run_in_process(sites, algorithm="cart", classes=["a", "b", "c"], refine_rounds=1, refine_from="one_round", record=record, q=0)
    assert out["result"]["refinement"]["status"] != "skipped"
    task = next(m for d, s, n, m in record if d == "to_site" and s == "site-1" and n == REFINE_COUNTS)
    masked = [m["masked"] for d, s, n, m in record if d == "to_server" and n == REFINE_COUNTS]
    total = secagg.sum_masked(masked)[:-1].reshape(-1, 3)
    tree = Tree.from_dict(task["tree"])
    cands = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=tree.feature_kinds)
    plan = refine.RefinePlan.from_dict(task["plan"], tree=tree, candidates=cands)
    own = refine.count_vector(tree, cands, plan, sites[0]["X_train"], sites[0]["y_train"]).reshape(-1, 3)
    assert own[:, 2].sum() > 0 and np.array_equal(total[:, 2], own[:, 2])


def test_a_tree_whose_leaves_hold_more_rows_than_its_root_is_refused(car):
    """A leaf's counts are its weight in the merge: a site that keeps its root at its declared rows but multiplies
    its leaves (1e9 x) would outweigh every other tree. Children may hold at most their parent's rows."""
    from treeflare.icdta4fl.encoding import tree_limits
    from treeflare.icdta4fl.payloads import check_train_reply
    from treeflare.icdta4fl.pipeline import train_local_tree
    from treeflare.trees.validate import PayloadError

    fed, _ = car
    site = _sites(fed)[0]
    tree = train_local_tree(site["X_train"], site["y_train"], algorithm="cart", n_classes=len(fed.schema.classes),
                            params={"max_depth": 4})
    limits = tree_limits(fed.schema, "cart", max_depth=4)
    reply = {"tree": tree, "n_train": len(site["y_train"]), "n_test": 10, "local": {"accuracy": 0.9, "macro_f1": 0.8}}
    assert check_train_reply(reply, limits=limits)["n_train"] == len(site["y_train"])
    inflated = {**tree, "nodes": [dict(n, counts=[c * (1 if i == 0 else 1e9) for c in n["counts"]])
                                  for i, n in enumerate(tree["nodes"])]}
    with pytest.raises(PayloadError, match="node 0's children hold more rows of some class than the node itself"):
        check_train_reply({**reply, "tree": inflated}, limits=limits)


def test_a_sites_own_list_of_the_federation_refuses_a_key_list_naming_another(car, tmp_path, monkeypatch):
    """The site's operator writes the federation's sites into its binding (``refine_peers``, app/site_setup.py bind
    --refine-peers): the server cannot rewrite it, and a key list naming any other site is refused by that site."""
    import json

    import treeflare.flare.icdta4fl.executor as executor_module
    from treeflare.flare.site_config import load_binding

    fed, root = car
    local = tmp_path / "site-1-kit" / "local"
    local.mkdir(parents=True)
    (local / "treeflare_site.json").write_text(json.dumps(
        {"data_dir": str(root / "site-1"), "refine_peers": ["site-1", "site-2", "site-3"]}))

    def binding(site, fl_ctx=None, job_data_root="", name=""):
        return load_binding(site, None, job_data_root, config_dir=local if site == "site-1" else tmp_path / "none",
                            name=name)

    monkeypatch.setattr(executor_module, "load_binding", binding)
    run = InProcessRun(root, fed.site_names)
    result = run.run(_controller(fed, root), tmp_path / "run")
    assert result["status"] == "completed", result.get("error")
    assert "key of site-4: not a site of this job" in result["dropped_sites"]["site-1"], result["dropped_sites"]
    assert result["refinement"]["status"].startswith("stopped at round 1: site-1 sent no valid masked counts")
    assert not [m for d, s, n, m in run.messages if d == "to_server" and s == "site-1" and n == REFINE_COUNTS
                and "masked" in m]
