"""The storage package's surface: sorted exports, and no backend client imported eagerly."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import sidecar.storage


class TestPackage:
    def test_all_is_sorted_and_public(self) -> None:
        """__all__ is sorted and names exactly the public names the package defines."""
        exported = sidecar.storage.__all__
        assert exported == sorted(exported)
        public = {
            name
            for name, value in vars(sidecar.storage).items()
            if not name.startswith("_")
            and not isinstance(value, ModuleType)  # submodules, once imported
            and name not in {"annotations", "TYPE_CHECKING"}
        }
        assert set(exported) == public

    def test_import_is_light(self) -> None:
        """Importing sidecar.storage pulls in neither aiobotocore nor botocore."""
        code = (
            "import sys, sidecar.storage; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'aiobotocore', 'botocore', 'aiohttp'}); print(heavy)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == "[]"
