"""jobs/icdta4fl/job.py moved into the package: `treeflare icdta4fl ...` (treeflare.jobs.icdta4fl). This file keeps
`python jobs/icdta4fl/job.py ...` working with the same options."""

import sys

from treeflare.jobs.icdta4fl import main

if __name__ == "__main__":
    sys.exit(main())
