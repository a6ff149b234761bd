"""scripts/schema.py moved into the package: `treeflare schema ...` (treeflare.tools.schema). This file keeps
`python scripts/schema.py ...` working with the same options."""

import sys

from treeflare.tools.schema import main

if __name__ == "__main__":
    sys.exit(main())
