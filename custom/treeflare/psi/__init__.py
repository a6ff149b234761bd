"""The vertical jobs' private set intersection, ECDH-PSI over X25519 (pure core, no NVFlare): ``group`` (hashing
onto X25519 and blinding, OpenSSL's), ``party`` (one party's protocol: chains, checks, the intersection of all),
``envelope`` (the parties' messages sealed end to end), ``session`` (a party as the relay talks to it) and
``relay`` (the server's side, which opens nothing; and the same relay in process). The FLARE glue is
``treeflare.flare.psi``."""
