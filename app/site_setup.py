"""app/site_setup.py moved into the package: `treeflare site ...` / `treeflare provision ...`
(treeflare.tools.site_setup). This file keeps `python app/site_setup.py ...` working with the same options, also on
a site's host without treeflare installed (the tool needs only the standard library and PyYAML, which NVFlare
installs): it is then run from this checkout by path."""

import sys

try:
    from treeflare.tools.site_setup import main
except ImportError:
    import importlib.util
    from pathlib import Path

    _tool = Path(__file__).resolve().parents[1] / "custom" / "treeflare" / "tools" / "site_setup.py"
    _spec = importlib.util.spec_from_file_location("site_setup", _tool)
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    main = _module.main

if __name__ == "__main__":
    sys.exit(main())
