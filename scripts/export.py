"""scripts/export.py moved into the package: `treeflare export ...` (treeflare.tools.export). This file keeps
`python scripts/export.py ...` working with the same options."""

import sys

from treeflare.tools.export import main

if __name__ == "__main__":
    sys.exit(main())
