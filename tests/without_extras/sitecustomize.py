"""With this folder on PYTHONPATH, a Python process runs as if the top-level modules named in
``MYNA_TEST_UNINSTALLED`` (comma-separated) were not installed: importing them fails, as in an
install without that extra. See ``without_modules`` in tests/conftest.py."""

import os
import sys

BLOCKED = {name for name in os.environ.get("MYNA_TEST_UNINSTALLED", "").split(",") if name}


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
