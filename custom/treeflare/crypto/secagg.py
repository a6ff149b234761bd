"""Pairwise-masked secure aggregation of integer vectors (the ICDTA4FL refinement round; Bonawitz et al. 2017).

Every site makes a fresh X25519 key pair per run and announces its public key, signed with its provisioned
identity (the startup kit's ``client.key``; its ``client.crt`` is issued by the project's ``rootCA.pem``). The
server forwards the list of announcements; every site checks the list itself (:func:`verify_key_list`): each
certificate chains to *its own* root CA, names the listed site, is a *client site's* certificate, the signature
covers (job id, site, key), the list is long enough and holds the site's own key unchanged. Each pair (i, j) then
derives a mask from its X25519 secret: HKDF-SHA256 (info = job id | round | the sorted participant list | the pair |
a digest of what the round asks, so that a server sending sites different questions gets no cancelling masks) keys a
ChaCha20 keystream read as uint64. Site i sends ``y_i = c_i + sum_{j>i} m_ij - sum_{j<i} m_ij  (mod 2^64)``; the
masks cancel only in the sum over every listed site, so a proper subset of the ``y_i`` is uniformly random.

The client-site check: the project's root CA also issues the server's certificate (``server.crt``, whose key the
server operator holds) and every admin's (project_admin, org_admin, lead, member). Without the check a deviating
server could list a victim beside "sites" named after those certificates, with X25519 keys it made and signed with
those keys, and unmask the victim. So a listed certificate is refused when NVFlare's provisioning marked it with any
role but "client" (every admin's certificate, and the server's in distributed provisioning), and an unmarked one
(``nvflare provision`` and POC mark no client's or server's certificate) when its CN is the server's identity as this
site's own kit names it (``fed_client.json``: the name NVFlare's client itself checks the server's certificate
against). With ``allowed_sites`` only the job's sites are accepted. What stays open: a certificate the root CA issued
unmarked to something else (a relay; an admin of a kit provisioned without roles) passes the role check, and is
refused only by ``allowed_sites``; whoever holds the root CA's key, or a site's kit, can sign as that site.

Without certificates (the FLARE simulator has no startup kits) keys are unauthenticated: a server that makes
keys itself can unmask a site. A site that has a root CA never accepts an unsigned key.

There is no secret sharing of the mask seeds: a listed site that does not send its vector leaves the sum
masked, and the round fails (cross-silo sites are few and online; the caller keeps its previous result).

Everything here is the ``cryptography`` package's: X25519, HKDF, ChaCha20, X.509 and RSA-PSS/ECDSA.
(About 400 lines: the key lists and the signed trees share one set of certificate checks, kept together.)
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import NameOID

__all__ = ["SecAggError", "SiteIdentity", "MaskingKeys", "key_statement", "check_key_record", "verify_key_list",
           "pair_mask", "sum_masked", "certificate_role", "check_signer", "tree_statement", "sign_tree",
           "verify_tree_list", "server_names_from_kit", "KIT_FILES", "KIT_CONFIG",
           "ROLE_OID", "CLIENT_ROLE", "MAX_SITES"]

KEY_BYTES = 32
MAX_SITES = 1000
MAX_CERT_CHARS = 16 * 1024
MAX_SIGNATURE_BYTES = 1024
MAX_VALUES = 10_000_000
KIT_FILES = {"key": "client.key", "cert": "client.crt", "ca": "rootCA.pem"}
KIT_CONFIG = "fed_client.json"  # a client kit's startup config; it names the server's identity
# A participant's role in its NVFlare certificate: the subject attribute unstructuredName (PKCS #9,
# OID 1.2.840.113549.1.9.2), which nvflare/lighter/utils.py ``x509_name(cn, org, role)`` adds when a role is given.
# - ``nvflare provision`` and ``nvflare poc prepare`` (nvflare/lighter/impl/cert.py CertBuilder.get_pri_key_cert)
#   give one to admins only: project_admin, org_admin, lead, member (nvflare/lighter/constants.py AdminRole);
#   client, relay and server certificates carry none.
# - distributed provisioning, ``nvflare cert sign -t TYPE`` (nvflare/tool/cert/cert_commands.py
#   _build_signed_cert), sets it to the type: client, server, org_admin, lead, member
#   (nvflare/tool/cert/cert_constants.py VALID_CERT_TYPES).
# NVFlare reads it back as the admin's role at login (nvflare/fuel/hci/security.py get_identity_info).
ROLE_OID = NameOID.UNSTRUCTURED_NAME
CLIENT_ROLE = "client"
_DOMAIN = b"treeflare-icdta4fl-secagg-v1"


class SecAggError(ValueError):
    """A key list, record or vector this site (or the server) must refuse."""


def key_statement(job_id: str, site: str, public_key: bytes) -> bytes:
    """What a site signs: its key, bound to the job and its own name (unambiguous: a JSON list)."""
    return _DOMAIN + b"|key|" + json.dumps([str(job_id), str(site), bytes(public_key).hex()]).encode()


def _common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if len(names) == 1 else None


def certificate_role(cert: x509.Certificate) -> str | None:
    """The role NVFlare's provisioning wrote into ``cert`` (see ``ROLE_OID``), or None if it wrote none."""
    roles = cert.subject.get_attributes_for_oid(ROLE_OID)
    if len(roles) > 1:
        raise SecAggError("the certificate carries more than one role")
    return str(roles[0].value) if roles else None


def _check_client_site(cert: x509.Certificate, name: str, server_names, what: str) -> None:
    """``cert`` (already known to name ``name``) is a client site's: marked "client", or unmarked and not the
    server's (``server_names``: the server's identity from this site's own kit; None: not known, so an unmarked
    certificate cannot be told from the server's and is refused)."""
    try:
        role = certificate_role(cert)
    except SecAggError as exc:
        raise SecAggError(f"{what}: {exc}") from None
    if role is not None and role != CLIENT_ROLE:
        raise SecAggError(f"{what}: the certificate's role is {role!r}, not a client site's")
    if role is None and server_names is None:
        raise SecAggError(f"{what}: the certificate carries no role, and this site was not told the server's identity "
                          "to tell the server's certificate from a site's")
    if role is None and name in server_names:
        raise SecAggError(f"{what}: the certificate is the server's ({name!r} is the server's identity in this "
                          f"site's {KIT_CONFIG}), not a client site's")


def server_names_from_kit(startup_dir) -> tuple[str, ...]:
    """The server's identity as a client kit's ``fed_client.json`` names it: ``servers[*].identity`` (the CN
    NVFlare's client requires of the server's certificate, nvflare/private/fed/client/communicator.py), or for a kit
    without one, the host of ``servers[*].service.target`` (NVFlare's fallback for older kits)."""
    path = Path(startup_dir) / KIT_CONFIG
    try:
        config = json.loads(path.read_text())
        servers = config["servers"]
        names = []
        for server in servers:
            name = server.get("identity") or str(server["service"]["target"]).rsplit(":", 1)[0]
            if not isinstance(name, str) or not name:
                raise ValueError("empty server identity")
            names.append(name)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SecAggError(f"the startup kit's {KIT_CONFIG} does not name the server ({type(exc).__name__}): "
                          "without it this site cannot tell the server's certificate from a site's") from None
    if not names:
        raise SecAggError(f"the startup kit's {KIT_CONFIG} names no server")
    return tuple(names)


def _check_issued(cert: x509.Certificate, root: x509.Certificate, what: str) -> None:
    """``cert`` was signed by ``root`` and is valid now."""
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        raise SecAggError(f"{what}: the certificate is not issued by this site's rootCA.pem") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise SecAggError(f"{what}: the certificate is not valid now")


def _verify_signature(public_key, signature: bytes, data: bytes) -> None:
    if isinstance(public_key, rsa.RSAPublicKey):
        public_key.verify(signature, data, padding.PSS(mgf=padding.MGF1(hashes.SHA256()),
                                                       salt_length=padding.PSS.MAX_LENGTH), hashes.SHA256())
    elif isinstance(public_key, ec.EllipticCurvePublicKey):
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    else:
        raise InvalidSignature("unsupported certificate key type")


@dataclass(frozen=True)
class SiteIdentity:
    """A site's provisioned identity: its private key and certificate, the root CA it trusts, and the server's
    identity its kit names (``server_names``: pass them to :func:`verify_key_list`)."""

    site: str
    private_key: object
    certificate: x509.Certificate
    root_ca: x509.Certificate
    server_names: tuple | None = None

    @classmethod
    def from_kit(cls, startup_dir, site: str) -> "SiteIdentity":
        """Read ``client.key``, ``client.crt``, ``rootCA.pem`` and the server's identity (``fed_client.json``) from a
        client site's startup kit folder; the certificate must chain to the root CA, name ``site`` and be a client
        site's (a kit for another site, the server's or an admin's kit is refused here, not at the peers)."""
        d = Path(startup_dir)
        if not (d / KIT_CONFIG).is_file():
            for config, whose in (("fed_server.json", "the server's"), ("fed_admin.json", "an admin's")):
                if (d / config).is_file():
                    raise SecAggError(f"{site}: the startup kit is {whose} ({config}), not a client site's: a site "
                                      "announces its key only with its own client kit")
        try:
            key = serialization.load_pem_private_key((d / KIT_FILES["key"]).read_bytes(), password=None)
            cert = x509.load_pem_x509_certificate((d / KIT_FILES["cert"]).read_bytes())
            root = x509.load_pem_x509_certificate((d / KIT_FILES["ca"]).read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise SecAggError(f"{site}: the startup kit's {', '.join(KIT_FILES.values())} cannot be read "
                              f"({type(exc).__name__})") from None
        if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
            raise SecAggError(f"{site}: the startup kit's client.key is neither RSA nor EC")
        _check_issued(cert, root, f"{site}'s own kit")
        if _common_name(cert) != site:
            raise SecAggError(f"{site}: the startup kit's certificate names {_common_name(cert)!r}, not this site")
        try:
            servers = server_names_from_kit(d)
        except SecAggError as exc:
            raise SecAggError(f"{site}: {exc}") from None
        _check_client_site(cert, site, servers, f"{site}'s own kit")
        return cls(site, key, cert, root, servers)

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private_key, rsa.RSAPrivateKey):
            return self.private_key.sign(data, padding.PSS(mgf=padding.MGF1(hashes.SHA256()),
                                                           salt_length=padding.PSS.MAX_LENGTH), hashes.SHA256())
        return self.private_key.sign(data, ec.ECDSA(hashes.SHA256()))

    def certificate_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")


class MaskingKeys:
    """One site's X25519 key pair for one job (fresh per run), its announcement, and its masking."""

    def __init__(self, site: str, job_id: str, identity: SiteIdentity | None = None):
        self.site, self.job_id, self.identity = str(site), str(job_id), identity
        self._private = x25519.X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(serialization.Encoding.Raw,
                                                              serialization.PublicFormat.Raw)

    def record(self) -> dict:
        """{site, public_key, certificate, signature}: plain strings and uint8 arrays (None without a kit)."""
        signed = self.identity is not None
        return {"site": self.site, "public_key": np.frombuffer(self.public, dtype=np.uint8).copy(),
                "certificate": self.identity.certificate_pem() if signed else None,
                "signature": (np.frombuffer(self.identity.sign(key_statement(self.job_id, self.site, self.public)),
                                            dtype=np.uint8).copy() if signed else None)}

    def mask(self, counts, peers: dict, round_no: int, context: bytes = b"") -> np.ndarray:
        """``counts`` (integers, negatives allowed: noise) as uint64 mod 2^64, plus this site's pairwise masks
        with every other site of ``peers`` (site -> 32-byte public key, this site included: the verified list).
        ``context``: a digest of the question the counts answer; masks cancel only between sites that were asked
        the same one."""
        values = np.asarray(counts)
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu") or values.size > MAX_VALUES:
            raise SecAggError(f"counts must be a 1-D integer array of at most {MAX_VALUES} values")
        if peers.get(self.site) != self.public:
            raise SecAggError(f"{self.site}: the participant list does not hold this site's own key")
        out = values.astype(np.int64).view(np.uint64).copy()
        participants = sorted(peers)
        for other in participants:
            if other == self.site:
                continue
            shared = self._shared(other, peers)
            m = pair_mask(shared, self.job_id, round_no, participants, (self.site, other), out.size, context)
            if other > self.site:
                out += m
            else:
                out -= m
        return out

    def _shared(self, other: str, peers: dict) -> bytes:
        """This site's X25519 secret with ``other`` (its key in ``peers``)."""
        try:
            return self._private.exchange(x25519.X25519PublicKey.from_public_bytes(peers[other]))
        except ValueError:
            raise SecAggError(f"public_key of {other}: not a usable X25519 key") from None

    def channel_key(self, other: str, peers: dict, purpose: str) -> bytes:
        """A 32-byte key this site shares with ``other`` alone (both listed in ``peers``, the verified list): HKDF of
        their X25519 secret, bound to the job, the pair, the participant list and ``purpose`` (what it encrypts)."""
        if peers.get(self.site) != self.public or other == self.site or other not in peers:
            raise SecAggError(f"{self.site}: no channel key with {str(other)[:80]!r} in this participant list")
        shared = self._shared(other, peers)
        info = _DOMAIN + b"|channel|" + json.dumps([self.job_id, str(purpose), sorted(peers),
                                                    sorted((self.site, other))]).encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def pair_mask(shared: bytes, job_id: str, round_no: int, participants, pair, n: int,
              context: bytes = b"") -> np.ndarray:
    """The mask of one pair for one round: HKDF-SHA256 of the X25519 secret keys a ChaCha20 keystream of ``n``
    uint64 values. The key is unique per pair, round and participant list, so the all-zero nonce never repeats."""
    info = _DOMAIN + b"|mask|" + json.dumps([str(job_id), int(round_no), sorted(participants),
                                             sorted(pair), bytes(context).hex()]).encode()
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
    stream = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor().update(b"\x00" * (8 * n))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def sum_masked(vectors) -> np.ndarray:
    """The server's side: the sum of every listed site's masked vector mod 2^64, read as signed int64."""
    vectors = list(vectors)
    if not vectors:
        raise SecAggError("nothing to add")
    total = np.zeros(vectors[0].shape, dtype=np.uint64)
    for v in vectors:
        total += v
    return total.view(np.int64)


def check_key_record(record, site: str) -> dict:
    """The shape of one announcement (either side checks it): ``site`` as named, a 32-byte key, and either both a
    PEM certificate and a signature or neither. Returns {site, public_key: bytes, certificate, signature}."""
    if not isinstance(record, dict) or set(record) != {"site", "public_key", "certificate", "signature"}:
        raise SecAggError(f"key of {site}: expected a dict of site, public_key, certificate, signature")
    if not isinstance(record["site"], str) or record["site"] != site:
        raise SecAggError(f"key of {site}: names site {str(record['site'])[:80]!r}")
    key = record["public_key"]
    if not isinstance(key, np.ndarray) or key.dtype != np.uint8 or key.shape != (KEY_BYTES,):
        raise SecAggError(f"key of {site}: public_key must be {KEY_BYTES} bytes (uint8 array)")
    try:  # a low-order point (all zeros, say) gives no shared secret: every peer would refuse the list
        x25519.X25519PrivateKey.generate().exchange(x25519.X25519PublicKey.from_public_bytes(key.tobytes()))
    except ValueError:
        raise SecAggError(f"key of {site}: public_key is not a usable X25519 key") from None
    cert, sig = record["certificate"], record["signature"]
    if (cert is None) != (sig is None):
        raise SecAggError(f"key of {site}: a certificate needs a signature and a signature a certificate")
    if cert is not None:
        if not isinstance(cert, str) or not 0 < len(cert) <= MAX_CERT_CHARS:
            raise SecAggError(f"key of {site}: certificate must be PEM text of at most {MAX_CERT_CHARS} characters")
        if not isinstance(sig, np.ndarray) or sig.dtype != np.uint8 or sig.ndim != 1 or \
                not 0 < sig.size <= MAX_SIGNATURE_BYTES:
            raise SecAggError(f"key of {site}: signature must be at most {MAX_SIGNATURE_BYTES} bytes (uint8 array)")
    return {"site": site, "public_key": key.tobytes(), "certificate": cert,
            "signature": None if sig is None else sig.tobytes()}


def check_signer(name: str, certificate, signature, statement: bytes, *, root_ca, server_names, what: str,
                 covers: str) -> None:
    """``signature`` over ``statement`` is ``name``'s, a client site of this project: its certificate (PEM text) is
    issued by ``root_ca`` and valid now, names ``name``, is a client site's (``_check_client_site``), and its key
    signed ``statement``."""
    if certificate is None or signature is None:
        raise SecAggError(f"{what}: unsigned, and this site accepts only statements signed with a startup kit's "
                          "certificate")
    try:
        cert = x509.load_pem_x509_certificate(str(certificate).encode("ascii"))
    except (ValueError, UnicodeError):
        raise SecAggError(f"{what}: the certificate is not a PEM X.509 certificate") from None
    _check_issued(cert, root_ca, what)
    if _common_name(cert) != name:
        raise SecAggError(f"{what}: the certificate names {_common_name(cert)!r}")
    _check_client_site(cert, name, None if server_names is None else frozenset(server_names), what)
    try:
        _verify_signature(cert.public_key(), bytes(signature), statement)
    except InvalidSignature:
        raise SecAggError(f"{what}: the signature does not cover {covers}") from None


def tree_statement(job_id: str, site: str, digest: str) -> bytes:
    """What a site signs for its local tree: the tree's digest, bound to the job and its own name."""
    return _DOMAIN + b"|tree|" + json.dumps([str(job_id), str(site), str(digest)]).encode()


def sign_tree(identity: "SiteIdentity | None", job_id: str, site: str, digest: str) -> dict:
    """{site, certificate, signature} for a local tree (None fields without a kit: unauthenticated)."""
    if identity is None:
        return {"site": site, "certificate": None, "signature": None}
    return {"site": site, "certificate": identity.certificate_pem(),
            "signature": np.frombuffer(identity.sign(tree_statement(job_id, site, digest)), dtype=np.uint8).copy()}


def verify_tree_list(owners, digests, signatures, *, site: str, own_digest: str, job_id: str, root_ca,
                     server_names=None) -> None:
    """A site's check of the trees the server sends for peer scoring: distinct owners, at most ``MAX_SITES``, this
    site's own tree among them unchanged, and with ``root_ca`` each tree signed by its owner, a client site of this
    project, for this job (so the server cannot slip in trees of its own, whose cells would then become what sites
    count on). Without a root CA (the simulator) the owners are taken as sent."""
    if not isinstance(owners, list) or not isinstance(signatures, list) or \
            not 0 < len(owners) == len(digests) == len(signatures) <= MAX_SITES:
        raise SecAggError(f"trees: expected 1 to {MAX_SITES} trees, each with its owner and signature")
    if not all(isinstance(o, str) and 0 < len(o) <= 256 for o in owners) or len(set(owners)) != len(owners):
        raise SecAggError("trees: owners must be distinct site names")
    if site not in owners or digests[owners.index(site)] != own_digest:
        raise SecAggError(f"trees: this site's own tree is {'changed' if site in owners else 'missing'}")
    if root_ca is None:
        return
    for owner, digest, record in zip(owners, digests, signatures):
        if not isinstance(record, dict) or set(record) != {"site", "certificate", "signature"} or \
                record["site"] != owner:
            raise SecAggError(f"tree of {owner}: expected its signature record")
        signature = record["signature"]
        if signature is not None and (not isinstance(signature, np.ndarray) or signature.dtype != np.uint8 or
                                      signature.ndim != 1 or not 0 < signature.size <= MAX_SIGNATURE_BYTES):
            raise SecAggError(f"tree of {owner}: signature must be at most {MAX_SIGNATURE_BYTES} bytes")
        check_signer(owner, record["certificate"], None if signature is None else signature.tobytes(),
                     tree_statement(job_id, owner, digest), root_ca=root_ca, server_names=server_names,
                     what=f"tree of {owner}", covers="this job, site and tree")


def verify_key_list(records, *, site: str, own_public: bytes, job_id: str, root_ca: x509.Certificate | None,
                    min_sites: int, server_names=None, allowed_sites=None) -> dict:
    """A site's check of the key list the server forwarded; returns {site: 32-byte public key} to mask with.

    With ``root_ca`` (a site with a startup kit) every key must carry a certificate issued by that root whose CN
    is the listed site, that is a client site's, and a signature of (job id, site, key) under it; without one (the
    simulator) keys are taken as sent (unauthenticated). A client site's certificate: NVFlare's role marking
    (``ROLE_OID``) says "client", or there is none (``nvflare provision``/POC kits) and the CN is not one of
    ``server_names`` (the server's identity from this site's own kit, :attr:`SiteIdentity.server_names`). Any other
    role (server, project_admin, org_admin, lead, member) is refused; so is an unmarked certificate when
    ``server_names`` is None (not told, this site cannot tell the server's certificate from a site's).
    ``allowed_sites``: when given, the job's sites; a listed name outside them is refused. Always: at least
    ``min_sites`` distinct sites, distinct keys, and this site's own key unchanged.
    """
    allowed = None if allowed_sites is None else frozenset(allowed_sites)
    servers = None if server_names is None else frozenset(server_names)
    if not isinstance(records, list) or not 0 < len(records) <= MAX_SITES:
        raise SecAggError(f"keys: expected a list of 1 to {MAX_SITES} announcements")
    keys = {}
    for i, rec in enumerate(records):
        name = rec.get("site") if isinstance(rec, dict) else None
        if not isinstance(name, str) or not name or len(name) > 256:
            raise SecAggError(f"keys[{i}]: site must be a non-empty name")
        if name in keys:
            raise SecAggError(f"keys[{i}]: {name} is listed twice")
        if allowed is not None and name not in allowed:
            raise SecAggError(f"key of {name}: not a site of this job")
        rec = check_key_record(rec, name)
        if root_ca is not None:
            check_signer(name, rec["certificate"], rec["signature"], key_statement(job_id, name, rec["public_key"]),
                         root_ca=root_ca, server_names=servers, what=f"key of {name}",
                         covers="this job, site and key")
        keys[name] = rec["public_key"]
    if len(set(keys.values())) != len(keys):
        raise SecAggError("keys: two sites announce the same public key")
    if keys.get(site) != bytes(own_public):
        raise SecAggError(f"keys: this site's own key is {'changed' if site in keys else 'missing'}")
    if len(keys) < min_sites:
        raise SecAggError(f"keys: {len(keys)} sites listed; this site masks only in a sum of at least {min_sites} "
                          "(from fewer, the others' counts follow from the sum and one's own)")
    return keys
