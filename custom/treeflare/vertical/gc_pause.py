"""Cyclic garbage collection paused for one protocol step of a party (no NVFlare).

A layer's step builds hundreds of thousands of small lists and tuples (split ids, decoded sums, candidate lists)
that form no reference cycles; with collection on, each full pass walks every one of them again, about 0.7 s of a
FATE-shape tree (measured with ``gc.callbacks``).  Reference counting still frees everything at once; collection
resumes as it was after the step, and collects then any cycle made meanwhile.
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
