"""Talking to a running FLARE system (a POC or a provisioned project) through an admin startup kit: one admin
session at a time (:func:`admin_session`), jobs submitted, awaited and downloaded, the sites' run folders gathered.

Everything here runs on the submitter's machine (never on a site).

    outcome = submit_and_collect(admin_kit, job_dir, out_dir, site_dirs=local_site_dirs(admin_kit))
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

FINISHED_OK = "FINISHED:COMPLETED"
NVFLARE_CONNECTING = "Connecting to FLARE ..."  # what NVFlare's admin API prints at every session it opens


class DeployError(RuntimeError):
    """A POC/provisioned system could not be started, reached or used; the message says what to do."""


def admin_username(admin_kit: Path) -> str:
    """The admin's user name: the common name of the kit's certificate (what the server authenticates)."""
    admin_kit = Path(admin_kit)
    cert = admin_kit / "startup" / "client.crt"
    if not cert.is_file():
        raise DeployError(f"{admin_kit} is not an admin startup kit (no startup/client.crt)")
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        subject = x509.load_pem_x509_certificate(cert.read_bytes()).subject
        return subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    except Exception:  # fall back to the folder name, which provisioning sets to the user name
        return admin_kit.name


@contextmanager
def _without_connecting_line():
    """NVFlare's admin API prints "Connecting to FLARE ..." each time a session opens (a job here opens three:
    submit, wait, progress); :func:`submit_and_collect` says it once instead. What the session's opening prints is
    held and printed after it, less only that exact line: every other message (a login error) still prints."""
    held = {sys.stdout: io.StringIO(), sys.stderr: io.StringIO()}
    try:
        with contextlib.redirect_stdout(held[sys.stdout]), contextlib.redirect_stderr(held[sys.stderr]):
            yield
    finally:
        for stream, buffer in held.items():
            text = "".join(line for line in buffer.getvalue().splitlines(keepends=True)
                           if line.strip() != NVFLARE_CONNECTING)
            if text:
                stream.write(text)
                stream.flush()


@contextmanager
def admin_session(admin_kit: Path, timeout: float = 30.0):
    """A secure admin session with the server ``admin_kit`` belongs to, closed on the way out. A server that
    cannot be reached is a :class:`DeployError` that says what to check."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    admin_kit = Path(admin_kit).resolve()
    try:
        with _without_connecting_line():
            sess = new_secure_session(admin_username(admin_kit), str(admin_kit), timeout=timeout)
    except Exception as exc:
        raise DeployError(f"cannot reach the FLARE server with the admin kit {admin_kit}: {exc}. "
                          "Is the server running (startup/start.sh, or treeflare poc up)?") from exc
    try:
        yield sess
    finally:
        sess.close()


def connected_sites(admin_kit: Path, timeout: float = 30.0) -> list[str]:
    with admin_session(admin_kit, timeout) as sess:
        return sorted(c.name for c in sess.get_connected_client_list())


def local_site_dirs(admin_kit: Path) -> dict:
    """Site workspaces next to the admin kit (a POC, or a project provisioned and run on this machine)."""
    prod = Path(admin_kit).resolve().parent
    return {p.name: p for p in sorted(prod.iterdir())
            if (p / "startup" / "fed_client.json").is_file()} if prod.is_dir() else {}


# --------------------------------------------------------------------------------------------- jobs
@dataclass
class JobOutcome:
    job_id: str
    status: str
    meta: dict
    out_dir: Path
    server_dir: Path | None = None  # the server's run folder (the controller's files)
    site_dirs: dict = field(default_factory=dict)  # site -> its gathered run folder

    @property
    def ok(self) -> bool:
        return self.status == FINISHED_OK


def submit_job(admin_kit: Path, job_dir: Path) -> str:
    job_dir = Path(job_dir).resolve()
    if not (job_dir / "meta.json").is_file():
        raise DeployError(f"{job_dir} is not a job folder (no meta.json); export one with `job.py --export DIR`")
    with admin_session(admin_kit) as sess:
        return sess.submit_job(str(job_dir))


def collect_job(admin_kit: Path, job_id: str, out_dir: Path, *, timeout: float = 3600.0, site_dirs=None,
                poll: float = 1.0) -> JobOutcome:
    """Wait for ``job_id`` to finish, download the server's result into ``out_dir/<job_id>/`` and copy each
    site's run folder found under ``site_dirs`` (site -> that site's workspace, on this machine) into
    ``out_dir/<site>/<job_id>/``. A job that does not finish in ``timeout`` seconds is aborted."""
    from nvflare.fuel.flare_api.api_spec import JobTimeout

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with admin_session(admin_kit) as sess:
        try:
            meta = sess.wait_for_job(job_id, timeout=timeout, poll_interval=poll)
        except JobTimeout:
            try:
                sess.abort_job(job_id)
            except Exception:
                pass
            raise DeployError(f"job {job_id} did not finish within {timeout:.0f} s; it was aborted")
        status = str(meta.get("status"))
        dest = out_dir / job_id
        if dest.exists():
            shutil.rmtree(dest)
        server_dir = None
        try:
            downloaded = sess.download_job_result(job_id, destination=str(out_dir))
            if downloaded and Path(downloaded).is_dir():
                server_dir = Path(downloaded) / "workspace"
                if not server_dir.is_dir():
                    server_dir = Path(downloaded)
        except Exception as exc:  # a failed job may have no result to download
            print(f"warning: could not download the result of job {job_id}: {exc}", file=sys.stderr)
    outcome = JobOutcome(job_id, status, meta, out_dir, server_dir)
    for site, site_ws in (site_dirs or {}).items():
        src = Path(site_ws) / job_id
        if src.is_dir():
            dst = out_dir / site / job_id
            if dst.exists():
                shutil.rmtree(dst)
            # the job's own code comes back with the server result; keep the site's logs and files
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("custom", "__pycache__"), symlinks=True)
            outcome.site_dirs[site] = dst
    (out_dir / f"{job_id}.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return outcome


def submit_and_collect(admin_kit: Path, job_dir: Path, out_dir: Path, *, timeout: float = 3600.0,
                       site_dirs=None, watch=None) -> JobOutcome:
    """``watch(job_id)``: a context manager kept open while the job runs (e.g. printing its progress)."""
    print(f"connecting to the FLARE server with the admin kit {Path(admin_kit).resolve()} ...", flush=True)
    job_id = submit_job(admin_kit, job_dir)
    print(f"submitted job {job_id} ({Path(job_dir).name}); waiting up to {timeout:.0f} s", flush=True)
    with (watch(job_id) if watch else nullcontext()):
        return collect_job(admin_kit, job_id, out_dir, timeout=timeout, site_dirs=site_dirs)
