"""Pairwise-masked secure aggregation (crypto/secagg.py): masks cancel only in the full sum, and a site refuses
every key list a deviating server could use to unmask it (substituted, foreign-CA, wrong-CN, unsigned, too short,
own key changed)."""

from __future__ import annotations

import datetime
import json

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from treeflare.crypto import secagg

JOB = "job-7"


def _name(cn, org=None, role=None):
    """A subject as NVFlare's ``lighter.utils.x509_name`` writes it: CN, O, and the role as unstructuredName."""
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    if role:
        attrs.append(x509.NameAttribute(NameOID.UNSTRUCTURED_NAME, role))
    return x509.Name(attrs)


def make_ca(project="project"):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(project)).issuer_name(_name(project))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def write_kit(folder, site, ca, cn=None, expired=False, role="client", server="localhost"):
    """A client startup kit's files for ``site`` as NVFlare's provisioning writes them: client.key (RSA 2048),
    client.crt (CN=site, O=org, and the role in unstructuredName: "client" as ``nvflare cert sign -t client``
    writes it; ``role=None`` as ``nvflare provision``/POC write a client's, with no role), rootCA.pem, and a
    fed_client.json naming the server's identity (``server``)."""
    ca_key, ca_cert = ca
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30 if expired else 0)
    cert = (x509.CertificateBuilder().subject_name(_name(cn or site, "org", role)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    write_pems(folder, "client", key, cert, ca_cert)
    (folder / "fed_client.json").write_text(json.dumps(
        {"format_version": 2, "servers": [{"name": "project", "service": {"target": f"{server}:8002"},
                                           "identity": server}],
         "client": {"ssl_private_key": "client.key", "ssl_cert": "client.crt", "ssl_root_cert": "rootCA.pem"}}))
    return folder


def write_pems(folder, stem, key, cert, ca_cert):
    """``<stem>.key``, ``<stem>.crt`` and ``rootCA.pem`` as a startup kit holds them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                                           serialization.NoEncryption()))
    (folder / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "rootCA.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))


SITES = ["site-1", "site-2", "site-3", "site-4"]


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kits")
    ca, other_ca = make_ca(), make_ca("other")
    ids = {s: secagg.SiteIdentity.from_kit(write_kit(tmp / s, s, ca), s) for s in SITES}
    return {"ids": ids, "ca": ca, "other_ca": other_ca, "tmp": tmp}


def _keys(kits, job=JOB):
    return {s: secagg.MaskingKeys(s, job, kits["ids"][s]) for s in SITES}


def _verify(keys, records, site="site-1", root=True, kits=None, min_sites=3):
    return secagg.verify_key_list(records, site=site, own_public=keys[site].public, job_id=JOB,
                                  root_ca=kits["ids"][site].root_ca if root else None, min_sites=min_sites)


def test_masks_cancel_only_in_the_full_sum(kits):
    keys = _keys(kits)
    records = [keys[s].record() for s in SITES]
    rng = np.random.default_rng(0)
    counts = {s: rng.integers(0, 300, 5000) for s in SITES}
    counts["site-2"][:10] -= 400  # noise can make a cell negative: it survives mod 2^64
    masked = {}
    for s in SITES:
        peers = _verify(keys, records, site=s, kits=kits)
        masked[s] = keys[s].mask(counts[s], peers, round_no=1)
    total = secagg.sum_masked(masked.values())
    assert np.array_equal(total, np.sum(list(counts.values()), axis=0))
    # a single site's masked vector is not its counts, nor close: uniform-looking 64-bit values
    for s in SITES:
        assert not np.array_equal(masked[s].view(np.int64), counts[s])
        assert np.mean(masked[s] > np.uint64(2 ** 63)) == pytest.approx(0.5, abs=0.05)
    # neither is any proper subset's sum the subset's counts
    three = secagg.sum_masked([masked[s] for s in SITES[:3]])
    assert np.mean(np.abs(three - np.sum([counts[s] for s in SITES[:3]], axis=0)) < 10 ** 6) < 0.01
    # masks are fresh per round and per run: round 2, or a new key pair, masks the same counts differently
    peers = _verify(keys, records, kits=kits)
    assert not np.array_equal(keys["site-1"].mask(counts["site-1"], peers, 2), masked["site-1"])


def test_a_substituted_key_is_refused(kits):
    """The man in the middle: the server replaces site-2's key with one it made (and knows the secret of)."""
    keys = _keys(kits)
    records = [keys[s].record() for s in SITES]
    server_made = secagg.MaskingKeys("site-2", JOB, None).record()
    for forged in (dict(records[1], public_key=server_made["public_key"]),          # site-2's signature kept
                   dict(server_made, certificate=records[1]["certificate"],       # a signature by nobody's key
                        signature=np.frombuffer(bytes(256), dtype=np.uint8).copy()),
                   server_made):                                                  # unsigned
        with pytest.raises(secagg.SecAggError, match="site-2"):
            _verify(keys, [records[0], forged, *records[2:]], kits=kits)
    # site-2's genuine announcement replayed in another job does not verify either
    other_job = secagg.MaskingKeys("site-2", "job-8", kits["ids"]["site-2"]).record()
    with pytest.raises(secagg.SecAggError, match="signature does not cover"):
        _verify(keys, [records[0], other_job, *records[2:]], kits=kits)


def test_a_certificate_from_another_ca_or_naming_another_site_is_refused(kits):
    keys = _keys(kits)
    records = [keys[s].record() for s in SITES]
    tmp = kits["tmp"]
    foreign = secagg.SiteIdentity.from_kit(write_kit(tmp / "foreign", "site-3", kits["other_ca"]), "site-3")
    rec = secagg.MaskingKeys("site-3", JOB, foreign).record()
    with pytest.raises(secagg.SecAggError, match="not issued by this site's rootCA.pem"):
        _verify(keys, [*records[:2], rec, records[3]], kits=kits)
    # site-4's real certificate and key, presented as site-3's: the CN says site-4
    as_site3 = secagg.MaskingKeys("site-3", JOB, secagg.SiteIdentity(
        "site-3", kits["ids"]["site-4"].private_key, kits["ids"]["site-4"].certificate,
        kits["ids"]["site-4"].root_ca)).record()
    with pytest.raises(secagg.SecAggError, match="names 'site-4'"):
        _verify(keys, [*records[:2], as_site3, records[3]], kits=kits)
    # an expired certificate from the right CA, naming the right site: refused where it is loaded, and by peers
    old = write_kit(tmp / "old3", "site-3", kits["ca"], expired=True)
    with pytest.raises(secagg.SecAggError, match="not valid now"):
        secagg.SiteIdentity.from_kit(old, "site-3")
    stale = secagg.SiteIdentity("site-3", serialization.load_pem_private_key((old / "client.key").read_bytes(), None),
                                x509.load_pem_x509_certificate((old / "client.crt").read_bytes()), kits["ca"][1])
    with pytest.raises(secagg.SecAggError, match="not valid now"):
        _verify(keys, [*records[:2], secagg.MaskingKeys("site-3", JOB, stale).record(), records[3]], kits=kits)
    # a kit whose certificate names another site is refused where it is loaded
    with pytest.raises(secagg.SecAggError, match="names 'site-9'"):
        secagg.SiteIdentity.from_kit(write_kit(tmp / "wrong", "site-1", kits["ca"], cn="site-9"), "site-1")


def test_short_lists_and_a_changed_or_missing_own_key_are_refused(kits):
    keys = _keys(kits)
    records = [keys[s].record() for s in SITES]
    with pytest.raises(secagg.SecAggError, match="at least 3"):
        _verify(keys, records[:2], kits=kits)
    assert set(_verify(keys, records[:2], kits=kits, min_sites=2)) == {"site-1", "site-2"}  # with noise
    with pytest.raises(secagg.SecAggError, match="own key is missing"):
        _verify(keys, records[1:], kits=kits)
    fresh = secagg.MaskingKeys("site-1", JOB, kits["ids"]["site-1"]).record()  # validly signed, not this run's
    with pytest.raises(secagg.SecAggError, match="own key is changed"):
        _verify(keys, [fresh, *records[1:]], kits=kits)
    with pytest.raises(secagg.SecAggError, match="listed twice"):
        _verify(keys, [*records, records[2]], kits=kits)
    with pytest.raises(secagg.SecAggError, match="public_key"):
        _verify(keys, [records[0], dict(records[1], public_key=records[1]["public_key"][:31]), *records[2:]],
                kits=kits)
    # the masking itself refuses a list without this site's key
    peers = _verify(keys, records, kits=kits)
    with pytest.raises(secagg.SecAggError, match="own key"):
        keys["site-1"].mask(np.zeros(4, dtype=np.int64), {k: v for k, v in peers.items() if k != "site-1"}, 1)


def test_without_a_kit_keys_are_unauthenticated_and_a_kit_site_refuses_them(kits):
    """Simulator: no certificates, keys taken as sent. A site that has a root CA never accepts an unsigned key
    (a server cannot strip the signatures to downgrade it)."""
    plain = {s: secagg.MaskingKeys(s, JOB) for s in SITES}
    records = [plain[s].record() for s in SITES]
    assert records[0]["certificate"] is None and records[0]["signature"] is None
    peers = _verify(plain, records, root=False, kits=kits)
    total = secagg.sum_masked(plain[s].mask(np.arange(5), _verify(plain, records, site=s, root=False, kits=kits), 1)
                              for s in SITES)
    assert np.array_equal(total, 4 * np.arange(5)) and len(peers) == 4
    with pytest.raises(secagg.SecAggError, match="unsigned"):
        _verify(plain, records, root=True, kits=kits)



def _signed_as(folder, name, ca):
    """An announcement signed with a kit's own key and certificate, taken as they are (no check of the kit)."""
    key = serialization.load_pem_private_key((folder / "client.key").read_bytes(), None)
    cert = x509.load_pem_x509_certificate((folder / "client.crt").read_bytes())
    return secagg.MaskingKeys(name, JOB, secagg.SiteIdentity(name, key, cert, ca[1])).record()


def test_only_client_sites_certificates_count_whichever_way_the_kits_were_provisioned(kits):
    """Distributed provisioning (``nvflare cert sign -t TYPE``) marks every certificate's role; ``nvflare provision``
    marks admins' only, and the server's certificate is then told apart by the server's identity in the site's own
    fed_client.json (with NVFlare's real kits: test_secagg_roles.py)."""
    keys = _keys(kits)
    records = [keys[s].record() for s in SITES]
    tmp, ca = kits["tmp"], kits["ca"]

    def check(extra, **kw):
        return secagg.verify_key_list([*records[:2], extra], site="site-1", own_public=keys["site-1"].public,
                                      job_id=JOB, root_ca=ca[1], min_sites=3, **kw)

    for role in ("server", "project_admin", "org_admin", "lead", "member"):
        kit = write_kit(tmp / f"role-{role}", "intruder", ca, role=role)
        for names in (None, ("localhost",)):
            with pytest.raises(secagg.SecAggError, match=f"key of intruder: the certificate's role is '{role}', not "
                                                         "a client site's"):
                check(_signed_as(kit, "intruder", ca), server_names=names)
        with pytest.raises(secagg.SecAggError, match=f"intruder's own kit: the certificate's role is '{role}'"):
            secagg.SiteIdentity.from_kit(kit, "intruder")
    # unmarked (as `nvflare provision` writes a site's certificate): a site's, unless its CN is the server's identity;
    # refused by a site not told the server's identity
    plain = _signed_as(write_kit(tmp / "plain9", "site-9", ca, role=None), "site-9", ca)
    server = _signed_as(write_kit(tmp / "srv", "localhost", ca, role=None), "localhost", ca)
    assert sorted(check(plain, server_names=("localhost",))) == ["site-1", "site-2", "site-9"]
    with pytest.raises(secagg.SecAggError, match="key of site-9: the certificate carries no role"):
        check(plain)
    with pytest.raises(secagg.SecAggError, match="key of localhost: the certificate is the server's"):
        check(server, server_names=("localhost",))
    with pytest.raises(secagg.SecAggError, match="key of site-9: not a site of this job"):
        check(plain, server_names=("localhost",), allowed_sites=SITES)
    # allowed_sites applies to unauthenticated keys too (the simulator)
    sim = {s: secagg.MaskingKeys(s, JOB) for s in ("site-1", "site-2", "site-9")}
    with pytest.raises(secagg.SecAggError, match="key of site-9: not a site of this job"):
        secagg.verify_key_list([sim[s].record() for s in sim], site="site-1", own_public=sim["site-1"].public,
                               job_id=JOB, root_ca=None, min_sites=3, allowed_sites=SITES)
