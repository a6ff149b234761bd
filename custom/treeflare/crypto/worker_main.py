"""Entry point of a worker process: ``python -m treeflare.crypto.worker_main MODULE...`` (see .workers)."""
import sys

from treeflare.crypto.workers import _serve

if __name__ == "__main__":
    _serve(sys.argv[1:])
