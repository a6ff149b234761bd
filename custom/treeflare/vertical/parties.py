"""The two party roles (kept as one import place): :mod:`.active` and :mod:`.passive`."""
from .active import ActiveParty, route
from .passive import PassiveParty, PassivePolicy

__all__ = ["ActiveParty", "PassiveParty", "PassivePolicy", "route"]
