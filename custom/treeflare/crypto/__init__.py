"""Additively homomorphic encryption: Paillier on gmpy2, a mock oracle, and packing helpers.

* :mod:`.paillier` -- keys, encryption, decryption, homomorphic addition (see its docstring for
  the public API and the two randomness modes);
* :mod:`.ou` -- Okamoto-Uchiyama (opt-in ``scheme="ou"``; same API shape; not secure against chosen
  ciphertexts: SECURITY.md, "Okamoto-Uchiyama");
* :mod:`.packing` -- slot layouts that pack several integers per plaintext and several summed
  results per returned ciphertext, with overflow detection;
* :mod:`.backend` -- the key-holder / public-context interface the vertical job uses (batches,
  worker processes, wire format);
* :mod:`.workers` -- persistent worker processes (no fork, no pickle);
* :mod:`.secagg` -- pairwise-masked secure aggregation with signed X25519 keys (ICDTA4FL refinement; not Paillier).
"""
from .backend import (CiphertextError, KeyHolder, MockKeyHolder, MockPublicKey, OuKeyHolder, OuPublic,
                      PaillierKeyHolder, PaillierPublic, PublicContext, make_key_holder,
                      public_from_message)
from .ou import OuPrivateKey, OuPublicKey
from .packing import SlotLayout, SlotOverflowError, pack_plan, required_width, unpack_fields
from .paillier import (MAX_KEY_BITS, MIN_SECURE_BITS, SECURE_KEY_SIZES, PaillierPrivateKey,
                       PaillierPublicKey, check_key_bits, security_bits)

__all__ = [
    "CiphertextError", "KeyHolder", "MockKeyHolder", "MockPublicKey", "OuKeyHolder", "OuPublic",
    "PaillierKeyHolder", "PaillierPublic", "PublicContext", "make_key_holder", "public_from_message",
    "SlotLayout", "SlotOverflowError", "pack_plan", "required_width", "unpack_fields",
    "MAX_KEY_BITS", "MIN_SECURE_BITS", "SECURE_KEY_SIZES", "PaillierPrivateKey", "PaillierPublicKey",
    "OuPrivateKey", "OuPublicKey", "check_key_bits", "security_bits",
]
