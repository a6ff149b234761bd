"""Secure aggregation's key list against NVFlare's own provisioned kits: the project's root CA also issues the
server's certificate and every admin's, so a deviating server could list a victim beside "sites" signed with
``server.key`` or an admin's ``client.key`` (keys it holds, or in POC has) and unmask the victim. Each site accepts
only client sites' certificates (crypto/secagg.py ``verify_key_list``), and only the job's sites when told them.

The kits are NVFlare's (``nvflare provision``'s builders, in process, once for the module): a server, 4 client sites
and admins of the roles project_admin, org_admin and lead. NVFlare marks a role (subject unstructuredName) on admins'
certificates only; the server's is told apart by its identity in each site's own ``fed_client.json``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from treeflare.crypto import secagg

JOB = "9a3c2d4e-roles"
SERVER = "flare.example.org"
SITES = ["site-1", "site-2", "site-3", "site-4"]
ADMINS = {"admin@example.org": "project_admin", "orgadmin@org1.example": "org_admin", "lead@org2.example": "lead"}
PROJECT = {
    "api_version": 3,
    "name": "secagg_roles",
    "description": "secure aggregation role check",
    "participants": [
        {"name": SERVER, "type": "server", "org": "hub", "fed_learn_port": 8002},
        *({"name": s, "type": "client", "org": f"org{i + 1}"} for i, s in enumerate(SITES)),
        *({"name": a, "type": "admin", "org": "org1" if r == "org_admin" else "org2" if r == "lead" else "hub",
           "role": r} for a, r in ADMINS.items()),
    ],
    "builders": [
        {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder"},
        {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
        {"path": "nvflare.lighter.impl.cert.CertBuilder"},
        {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
    ],
}


class _Quiet:
    def __init__(self):
        self.lines = []

    def info(self, msg):
        self.lines.append(str(msg))

    debug = warning = error = info


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    """Provision the project once, with NVFlare's provisioner in process (HOME pointed at the test's folder)."""
    from nvflare.lighter.constants import CtxKey, WorkDir
    from nvflare.lighter.prov_utils import prepare_builders
    from nvflare.lighter.provision import prepare_project
    from nvflare.lighter.provisioner import Provisioner

    root = tmp_path_factory.mktemp("provision")
    (root / "home").mkdir()
    log = _Quiet()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(root / "home"))
        mp.chdir(root)
        config = {**PROJECT, "participants": [dict(p) for p in PROJECT["participants"]]}
        ctx = Provisioner(str(root / "ws"), prepare_builders(config)).provision(prepare_project(config), logger=log)
    assert not ctx.get(CtxKey.BUILD_ERROR), log.lines
    return Path(ctx.get(WorkDir.CURRENT_PROD_DIR))


@pytest.fixture(scope="module")
def ids(prod):
    return {s: secagg.SiteIdentity.from_kit(prod / s / "startup", s) for s in SITES}


def _startup(prod, name):
    return prod / name / "startup"


def _holder(prod, name, cert_file, key_file, root_ca):
    """What a deviating server signs with: the key and certificate of a kit it holds, used as they are."""
    d = _startup(prod, name)
    key = serialization.load_pem_private_key((d / key_file).read_bytes(), password=None)
    return secagg.SiteIdentity(name, key, x509.load_pem_x509_certificate((d / cert_file).read_bytes()), root_ca)


def _records(ids, sites):
    keys = {s: secagg.MaskingKeys(s, JOB, ids[s]) for s in sites}
    return keys, [keys[s].record() for s in sites]


def _verify(ids, keys, records, site, **kw):
    return secagg.verify_key_list(records, site=site, own_public=keys[site].public, job_id=JOB,
                                  root_ca=ids[site].root_ca, min_sites=3,
                                  server_names=kw.pop("server_names", ids[site].server_names), **kw)


def test_the_kits_mark_roles_as_nvflare_provision_does(prod, ids):
    """What the checks rest on: admins' certificates carry their role; sites' and the server's carry none; each
    site's kit names the server's identity, which is the server certificate's CN."""
    for admin, role in ADMINS.items():
        cert = x509.load_pem_x509_certificate((_startup(prod, admin) / "client.crt").read_bytes())
        assert secagg.certificate_role(cert) == role
        assert [a.value for a in cert.subject.get_attributes_for_oid(secagg.ROLE_OID)] == [role]
    server_cert = x509.load_pem_x509_certificate((_startup(prod, SERVER) / "server.crt").read_bytes())
    assert secagg.certificate_role(server_cert) is None
    assert server_cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value == SERVER
    for s in SITES:
        assert secagg.certificate_role(ids[s].certificate) is None
        assert ids[s].server_names == (SERVER,)
    assert secagg.ROLE_OID.dotted_string == "1.2.840.113549.1.9.2"


def test_three_genuine_client_sites_are_accepted_by_each_and_their_masks_cancel(ids):
    sites = SITES[:3]
    keys, records = _records(ids, sites)
    counts = {s: np.arange(6) * (i + 1) for i, s in enumerate(sites)}
    masked = []
    for s in sites:
        peers = _verify(ids, keys, records, s, allowed_sites=sites)
        assert sorted(peers) == sites
        masked.append(keys[s].mask(counts[s], peers, round_no=1))
    assert np.array_equal(secagg.sum_masked(masked), sum(counts.values()))
    # a site that was not told its server's identity cannot tell the server's certificate from a site's: refused
    with pytest.raises(secagg.SecAggError, match="key of site-1: the certificate carries no role"):
        _verify(ids, keys, records, "site-1", server_names=None)


@pytest.mark.parametrize("holder, files, reason", [
    (SERVER, ("server.crt", "server.key"), f"the certificate is the server's \\('{SERVER}' is the server's identity"),
    ("admin@example.org", ("client.crt", "client.key"), "the certificate's role is 'project_admin', not a client"),
    ("orgadmin@org1.example", ("client.crt", "client.key"), "the certificate's role is 'org_admin', not a client"),
    ("lead@org2.example", ("client.crt", "client.key"), "the certificate's role is 'lead', not a client"),
], ids=["server", "project_admin", "org_admin", "lead"])
def test_a_list_padded_with_the_servers_or_an_admins_certificate_is_refused(prod, ids, holder, files, reason):
    """The deviating server lists {victim, one genuine site, one identity it holds} with an X25519 key it made for
    the latter (so it would know that pair's secret), validly signed with that kit's own key."""
    keys, records = _records(ids, ["site-1", "site-2"])
    forged = secagg.MaskingKeys(holder, JOB, _holder(prod, holder, *files, ids["site-1"].root_ca)).record()
    for victim in ("site-1", "site-2"):
        with pytest.raises(secagg.SecAggError, match=f"key of {holder}: {reason}"):
            _verify(ids, keys, [*records, forged], victim)
    # the same, with a fourth genuine site so the list is long enough without the intruder: still refused
    keys4, records4 = _records(ids, SITES[:3])
    with pytest.raises(secagg.SecAggError, match=f"key of {holder}: "):
        _verify(ids, keys4, [*records4, forged], "site-1")


def test_allowed_sites_refuses_a_genuine_site_that_is_not_the_jobs(ids):
    keys, records = _records(ids, ["site-1", "site-2", "site-4"])
    job_sites = ["site-1", "site-2", "site-3"]
    with pytest.raises(secagg.SecAggError, match="key of site-4: not a site of this job"):
        _verify(ids, keys, records, "site-1", allowed_sites=job_sites)
    assert sorted(_verify(ids, keys, records, "site-1", allowed_sites=SITES)) == ["site-1", "site-2", "site-4"]
    assert sorted(_verify(ids, keys, records, "site-1")) == ["site-1", "site-2", "site-4"]  # not told: any site


def test_a_server_or_admin_kit_cannot_announce(prod, tmp_path):
    with pytest.raises(secagg.SecAggError, match=r"the startup kit is the server's \(fed_server.json\)"):
        secagg.SiteIdentity.from_kit(_startup(prod, SERVER), SERVER)
    for admin in ADMINS:
        with pytest.raises(secagg.SecAggError, match=r"the startup kit is an admin's \(fed_admin.json\)"):
            secagg.SiteIdentity.from_kit(_startup(prod, admin), admin)
    # an admin's key and certificate placed in a client kit's folder: refused for the certificate's role
    for admin, role in ADMINS.items():
        kit = tmp_path / admin
        shutil.copytree(_startup(prod, "site-3"), kit)
        for f in ("client.crt", "client.key"):
            shutil.copyfile(_startup(prod, admin) / f, kit / f)
        with pytest.raises(secagg.SecAggError, match=f"{admin}'s own kit: the certificate's role is '{role}'"):
            secagg.SiteIdentity.from_kit(kit, admin)
    # the server's key and certificate as a client kit's: refused, the CN is the server's identity
    kit = tmp_path / "server-as-site"
    shutil.copytree(_startup(prod, "site-3"), kit)
    shutil.copyfile(_startup(prod, SERVER) / "server.crt", kit / "client.crt")
    shutil.copyfile(_startup(prod, SERVER) / "server.key", kit / "client.key")
    with pytest.raises(secagg.SecAggError, match=f"{SERVER}'s own kit: the certificate is the server's"):
        secagg.SiteIdentity.from_kit(kit, SERVER)
    # a client kit without fed_client.json does not say who the server is: refused
    kit = tmp_path / "no-config"
    shutil.copytree(_startup(prod, "site-3"), kit)
    (kit / "fed_client.json").unlink()
    with pytest.raises(secagg.SecAggError, match="site-3: the startup kit's fed_client.json does not name the server"):
        secagg.SiteIdentity.from_kit(kit, "site-3")
