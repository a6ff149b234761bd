"""Additively homomorphic encryption for the vertical job: Paillier on gmpy2 + a mock oracle."""
from .backend import (CiphertextError, KeyHolder, MockKeyHolder, MockPublicKey, PaillierKeyHolder,
                      PaillierPublic, PublicContext, default_workers, make_key_holder,
                      public_from_message)
from .paillier import MIN_SECURE_BITS, PaillierPrivateKey, PaillierPublicKey, security_bits

__all__ = [
    "CiphertextError", "KeyHolder", "MockKeyHolder", "MockPublicKey", "PaillierKeyHolder",
    "PaillierPublic", "PublicContext", "default_workers", "make_key_holder", "public_from_message",
    "MIN_SECURE_BITS", "PaillierPrivateKey", "PaillierPublicKey", "security_bits",
]
