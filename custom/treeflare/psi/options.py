"""The PSI phase's command-line options, shared by ``treeflare psi`` and the vertical jobs (no NVFlare import)."""

from __future__ import annotations

from .party import DEFAULT_MAX_RATIO, check_ratio

METHODS = ("ecdh", "nvflare")


def ratio_option(value: str) -> float:
    import argparse

    try:
        return check_ratio(float(value), "--psi-max-ratio")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_psi_args(group) -> None:
    group.add_argument("--psi", choices=METHODS, default="ecdh",
                       help="the private set intersection: ecdh (treeflare's ECDH-PSI over X25519: both parties "
                            "compute at once, the server relays sealed messages; default) or nvflare (NVFlare's "
                            "DH-PSI on openmined-psi)")
    group.add_argument("--psi-max-ratio", type=ratio_option, default=DEFAULT_MAX_RATIO, metavar="R",
                       help=f"stop before any encryption when a party holds more than R times the ids of the largest "
                            f"other party (default {DEFAULT_MAX_RATIO:g}; a site may lower it with "
                            "$TREEFLARE_PSI_MAX_RATIO): a party that enlarges its set learns whether each id it adds "
                            "is in the others'")
