"""Vertical federated decision trees with packed Paillier encryption (pure protocol, no NVFlare)."""
from .active import ActiveParty
from .driver import (VerticalData, canonical, close_parties, compare_runs, crypto_report, joint_model,
                     make_parties, metrics, run_oracle, run_protocol, run_vertical, synthetic)
from .messages import ProtocolError
from .objectives import OBJECTIVES
from .params import VerticalParams
from .passive import PassiveParty, PassivePolicy
from .prediction import ActivePredictor, PassivePredictor, run_prediction

__all__ = [
    "VerticalData", "canonical", "close_parties", "compare_runs", "crypto_report", "joint_model",
    "make_parties", "metrics", "run_oracle", "run_protocol", "run_vertical", "synthetic", "ProtocolError",
    "OBJECTIVES", "VerticalParams", "ActiveParty",
    "PassiveParty", "PassivePolicy", "ActivePredictor", "PassivePredictor", "run_prediction",
]
