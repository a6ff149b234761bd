"""The slot layouts moved to :mod:`treeflare.crypto.packing` (shared with other jobs); re-exported here."""
from ..crypto.packing import (SlotLayout, SlotOverflowError, pack_plan, required_width,
                              unpack_fields)

__all__ = ["SlotLayout", "SlotOverflowError", "pack_plan", "required_width", "unpack_fields"]
