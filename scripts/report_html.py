"""scripts/report_html.py moved into the package: `treeflare report ...` (treeflare.tools.report_html). This file keeps
`python scripts/report_html.py ...` working with the same options."""

import sys

from treeflare.tools.report_html import main

if __name__ == "__main__":
    sys.exit(main())
