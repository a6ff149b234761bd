"""jobs/vertical_tree/job.py moved into the package: `treeflare vertical ...` (treeflare.jobs.vertical_tree). This file keeps
`python jobs/vertical_tree/job.py ...` working with the same options."""

import sys

from treeflare.jobs.vertical_tree import main

if __name__ == "__main__":
    sys.exit(main())
