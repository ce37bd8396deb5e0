"""The readserver package's surface: sorted exports, and the layering (no app, no tiering)."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import sidecar.readserver


class TestPackage:
    """What ``import sidecar.readserver`` offers and pulls in."""

    def test_all_is_sorted_and_public(self) -> None:
        """__all__ is sorted and names exactly the public names the package defines."""
        exported = sidecar.readserver.__all__
        assert exported == sorted(exported)
        public = {
            name
            for name, value in vars(sidecar.readserver).items()
            if not name.startswith("_")
            and not isinstance(value, ModuleType)
            and name != "annotations"
        }
        assert set(exported) == public

    def test_layering(self) -> None:
        """The read path imports neither the composition root, tiering, nor aiokafka."""
        code = (
            "import sys, sidecar.readserver, sidecar.readserver.__main__; "
            "bad = sorted(m for m in sys.modules if m.startswith(('sidecar.app', "
            "'sidecar.tiering', 'aiokafka.producer', 'aiokafka.consumer'))); print(bad)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == "[]"
