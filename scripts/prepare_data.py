"""scripts/prepare_data.py moved into the package: `treeflare prepare ...` (treeflare.tools.prepare_data). This file keeps
`python scripts/prepare_data.py ...` working with the same options."""

import sys

from treeflare.tools.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
