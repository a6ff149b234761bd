"""scripts/predict.py moved into the package: `treeflare predict ...` (treeflare.tools.predict). This file keeps
`python scripts/predict.py ...` working with the same options."""

import sys

from treeflare.tools.predict import main

if __name__ == "__main__":
    sys.exit(main())
