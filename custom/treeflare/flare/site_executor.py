"""What our site executors share: each task goes to its handler, and any failure becomes a reply, never a crash of
the site.

The full error (cell values, local paths) stays in the site's own log; the server gets the redacted form
(:func:`treeflare.data.errors.public_error`): a :class:`DataError`'s redacted text, the message of the types in
``PUBLIC_ERRORS`` (errors about what the server sent, which hold no site data), else the exception's type alone.
An error saying the site's data is missing or unreadable (``data.errors.SITE_DATA``: its operator's configuration,
not bad rows) is marked so in the reply (``FAILURE_KEY``), for a controller that stops the job rather than go on
without the site.
"""

from __future__ import annotations

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ..data.errors import SITE_DATA, is_site_data_error, public_error

# a failed reply's field saying what failed: SITE_DATA when the site's data is missing or unreadable
FAILURE_KEY = "failure"


class SiteExecutor(Executor):
    PUBLIC_ERRORS: tuple = ()

    def handlers(self) -> dict:
        """Task name -> ``method(site, shareable, fl_ctx)`` returning the reply."""
        raise NotImplementedError

    def failed(self, fl_ctx) -> None:
        """Called after a handler raised, before the error reply is made (e.g. to stop worker processes)."""

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        handler = self.handlers().get(task_name)
        if handler is None:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        try:
            return handler(site, shareable, fl_ctx)
        except Exception as exc:  # noqa: BLE001 -- any failure becomes a reply, never a crash of the site
            self.log_error(fl_ctx, f"{task_name} failed at {site}: {type(exc).__name__}: {exc}")
            self.failed(fl_ctx)
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=self.PUBLIC_ERRORS)
            if is_site_data_error(exc):
                reply[FAILURE_KEY] = SITE_DATA
            return reply
