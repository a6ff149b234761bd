"""Vertical federated decision trees with packed Paillier encryption (pure protocol, no NVFlare)."""
from .driver import (VerticalData, canonical, compare_runs, crypto_report, joint_model, make_parties,
                     metrics, run_oracle, run_protocol, run_vertical, synthetic)
from .messages import ProtocolError
from .packing import SlotLayout, SlotOverflowError, required_width
from .params import VerticalParams
from .parties import ActiveParty, PassiveParty, route

__all__ = [
    "VerticalData", "canonical", "compare_runs", "crypto_report", "joint_model", "make_parties",
    "metrics", "run_oracle", "run_protocol", "run_vertical", "synthetic", "ProtocolError",
    "SlotLayout", "SlotOverflowError", "required_width", "VerticalParams", "ActiveParty",
    "PassiveParty", "route",
]
