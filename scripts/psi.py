"""scripts/psi.py moved into the package: `treeflare psi ...` (treeflare.tools.psi). This file keeps
`python scripts/psi.py ...` working with the same options."""

import sys

from treeflare.tools.psi import main

if __name__ == "__main__":
    sys.exit(main())
