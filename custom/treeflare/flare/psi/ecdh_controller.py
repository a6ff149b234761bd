"""The server's ECDH-PSI workflow (``--psi ecdh``, the default), between the phase's check and result workflows: it
drives :func:`treeflare.psi.relay.relay` with one aux message per site and round (each site's own inbox, pushed to
all sites at once: a task would wait for each site's next poll), and so relays the parties' sealed messages without
opening any (it holds no key).

A site that does not answer a request within the task timeout (a stalled or gone party), answers with an error, or
sends what the relay refuses (a message of no protocol's shape or size, to nobody of the run) ends the phase naming
the site and the round; the other sites delete whatever they kept. ``psi_result.json`` gets ``ecdh``: rounds,
messages and bytes relayed, the chunk and the ratio bound.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable

from ...psi.party import CHUNK, DEFAULT_MAX_RATIO, PsiError, check_chunk, check_ratio
from ...psi.relay import relay
from ..progress import say
from ..workflow import JobFailed
from .audit import record_exchange
from .controller import PsiSiteFailed, _PsiPhase, discard_at_sites
from .protocol import ECDH_TOPIC, run_dir_of


class EcdhPsiController(_PsiPhase):
    PART = "ecdh"

    def __init__(self, sites: list | None = None, kinds=("train", "test"), min_rows: int = 50,
                 task_timeout: int = 600, max_ratio: float = DEFAULT_MAX_RATIO, chunk: int = CHUNK,
                 audit: bool = False, **kwargs):
        """``audit``: record every request and reply relayed in ``<server run folder>/psi_audit.jsonl``
        (``audit.record_exchange``), for a test or reviewer to check what the server sees."""
        super().__init__(sites=sites, kinds=kinds, min_rows=min_rows, task_timeout=task_timeout, **kwargs)
        self.max_ratio = check_ratio(max_ratio)
        self.chunk = check_chunk(chunk)
        self.audit = bool(audit)

    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        sizes = {s: int(sum(result["parties"][s]["rows_before"].values())) for s in self.sites}
        say(fl_ctx, f"PSI: ECDH-PSI over X25519 between {len(self.sites)} parties (the server relays sealed messages)")
        gen = relay(self.sites, sizes, max_ratio=self.max_ratio, chunk=self.chunk)
        reqs = next(gen)
        t0 = time.perf_counter()
        self._threads = ThreadPoolExecutor(max_workers=len(self.sites), thread_name_prefix="psi-relay")
        try:
            while True:
                replies = self._exchange(reqs, abort_signal, fl_ctx)
                reqs = gen.send(replies)
        except StopIteration as stop:
            result["ecdh"] = {**stop.value, "chunk": self.chunk, "max_ratio": self.max_ratio,
                              "seconds": time.perf_counter() - t0}
        except (PsiError, JobFailed) as exc:  # every site deletes what it kept, but one that stopped answering
            discard_at_sites(self, fl_ctx, abort_signal, exc.site if isinstance(exc, PsiSiteFailed) else None)
            raise JobFailed(f"PSI (ECDH): {exc}") from None
        except Exception:  # noqa: BLE001 -- a bug, or a reply nothing foresaw: the job fails with it, nothing kept
            discard_at_sites(self, fl_ctx, abort_signal)
            raise
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _exchange(self, reqs: dict, abort_signal, fl_ctx) -> dict:
        """One request to each site (its own inbox), as aux messages, all at once; every reply, or JobFailed naming
        a site that sent none within the task timeout, or an error."""
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed("aborted during the PSI phase")
        step = reqs[self.sites[0]].get("round")
        label = f"ECDH-PSI round {step}" if step else "the ECDH-PSI start"
        engine = fl_ctx.get_engine()

        def ask(site):  # NVFlare 2.9's multicast_aux_requests fails (an abort_signal its cell does not take)
            with engine.new_context() as ctx:
                return (engine.send_aux_request(targets=[site], topic=ECDH_TOPIC,
                                                request=Shareable({"request": reqs[site]}),
                                                timeout=float(self.task_timeout), fl_ctx=ctx) or {}).get(site)

        answers = dict(zip(self.sites, self._threads.map(ask, self.sites)))
        replies = {}
        for site in self.sites:
            answer = answers.get(site)
            rc = answer.get_return_code() if answer is not None else None
            if answer is None or rc in (ReturnCode.TIMEOUT, ReturnCode.COMMUNICATION_ERROR):
                raise PsiSiteFailed(site, f"no reply to {label} within {self.task_timeout} s (a stalled or gone party)")
            if rc != ReturnCode.OK:
                raise JobFailed(f"{site}: {label} failed: {str(answer.get('error') or rc)[:2000]}")
            replies[site] = answer.get("reply")
        if self.audit:
            record_exchange(run_dir_of(fl_ctx), label, reqs, replies)
        return replies
