"""The addon as mitmdump loads it: the entry file imports the package beside it.

mitmproxy's script loader (mitmproxy/addons/script.py, `load_script` in
12.2.3) runs the entry file with its directory first on `sys.path` (and
leaves it there: its `finally` restores the same list it changed) and
leaves `sys.modules` alone, so a package named `ppp_addon` imported before
(an earlier load, another copy of the addon) would be reused by a plain
import. These tests load copies of assets/addon/ the way ppp
writes them out (one directory per version) through mitmproxy's own loader
and check that every module of `ppp_addon` in use is the copy's own.

Run by tests/addon.rs (under pytest); needs no daemon.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import types
import unittest
from pathlib import Path

from mitmproxy.addons import script

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "assets" / "addon"


def copy_addon(into: Path, mark: str) -> Path:
    """assets/addon/ copied to `into`, with `MARK = mark` added to one module
    the entry file does not import by name; returns the entry file."""
    shutil.copytree(ADDON, into, ignore=shutil.ignore_patterns("__pycache__"))
    with open(into / "ppp_addon" / "scrubber.py", "a", encoding="utf-8") as f:
        f.write(f"\nMARK = {mark!r}\n")
    return into / "addon.py"


def loaded(entry: Path) -> types.ModuleType:
    m = script.load_script(str(entry))
    assert m is not None, f"mitmproxy could not load {entry}"
    return m


def package_files() -> dict[str, Path]:
    return {
        name: Path(m.__file__).resolve()
        for name, m in list(sys.modules.items())
        if (name == "ppp_addon" or name.startswith("ppp_addon.")) and getattr(m, "__file__", None)
    }


class PackageTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="ppp-addon-pkg-"))
        self.saved_modules = dict(sys.modules)
        self.saved_path = list(sys.path)

    def tearDown(self) -> None:
        sys.path[:] = self.saved_path
        for name in [n for n in sys.modules if n not in self.saved_modules]:
            del sys.modules[name]
        sys.modules.update(self.saved_modules)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assert_own_modules(self, entry: Path, mark: str) -> None:
        files = package_files()
        pkg = (entry.parent / "ppp_addon").resolve()
        self.assertIn("ppp_addon.decisions", files)
        for name, path in files.items():
            self.assertEqual(path.parent, pkg, f"{name} came from {path}, not from beside {entry}")
        self.assertEqual(sys.modules["ppp_addon.scrubber"].MARK, mark)

    def test_the_siblings_win_over_a_package_already_imported(self) -> None:
        # A stale `ppp_addon` (another copy of the addon, or an older ppp's)
        # already imported, and first on the path.
        stale = self.tmp / "stale"
        copy_addon(stale, "stale")
        sys.path.insert(0, str(stale))
        import ppp_addon.scrubber  # noqa: F401 - the stale copy, on purpose

        self.assertEqual(sys.modules["ppp_addon.scrubber"].MARK, "stale")
        entry = copy_addon(self.tmp / "addon-new", "new")
        m = loaded(entry)
        self.assert_own_modules(entry, "new")
        # The hooks come from the same modules.
        self.assertIs(sys.modules["ppp_addon.http_flow"].Http, m.PppAddon.__mro__[4])
        self.assertTrue(callable(m.addons[0].requestheaders))

    def test_two_versions_loaded_one_after_the_other_each_use_their_own(self) -> None:
        old = copy_addon(self.tmp / "addon-old", "old")
        new = copy_addon(self.tmp / "addon-new", "new")
        loaded(old)
        self.assert_own_modules(old, "old")
        loaded(new)
        self.assert_own_modules(new, "new")
        # And back: a reload of the first script re-reads its own modules.
        loaded(old)
        self.assert_own_modules(old, "old")

    def test_a_module_changed_on_disk_is_read_again_on_reload(self) -> None:
        # mitmproxy's reload of a script is `load_script` again: the entry
        # file must not keep the modules of its previous run.
        entry = copy_addon(self.tmp / "addon-x", "first")
        loaded(entry)
        self.assert_own_modules(entry, "first")
        scrubber = entry.parent / "ppp_addon" / "scrubber.py"
        scrubber.write_text(scrubber.read_text(encoding="utf-8").replace("MARK = 'first'", "MARK = 'second'"))
        loaded(entry)
        self.assert_own_modules(entry, "second")

    def test_a_missing_package_is_a_load_error_not_a_stale_import(self) -> None:
        stale = self.tmp / "stale"
        copy_addon(stale, "stale")
        sys.path.insert(0, str(stale))
        import ppp_addon  # noqa: F401 - the stale copy, on purpose

        entry = copy_addon(self.tmp / "addon-broken", "x")
        shutil.rmtree(entry.parent / "ppp_addon")
        # load_script logs the error and returns None, never the stale
        # copy's hooks; mitmdump exits on an error logged at startup (its
        # ErrorCheck addon), so the daemon's supervisor restarts it.
        self.assertIsNone(script.load_script(str(entry)))
        self.assertNotIn("ppp_addon", sys.modules)


if __name__ == "__main__":
    unittest.main()
