"""jobs/xgb_histogram/job.py moved into the package: `treeflare xgb ...` (treeflare.jobs.xgb_histogram). This file keeps
`python jobs/xgb_histogram/job.py ...` working with the same options."""

import sys

from treeflare.jobs.xgb_histogram import main

if __name__ == "__main__":
    sys.exit(main())
