"""Write ``docs/screenshots/ui.png``: the dashboard (note 012) of a throwaway server with
two running jobs, one pending on its team's quota and one of another team.

Run by hand (the tests never write into the repository)::

    python scripts/ui_screenshot.py [OUT.png]

Needs what the browser tests need: Debian's chromium and chromium-driver, selenium.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_ui import busy, open_browser, ui_server, until, wait_until_plots_are_shown  # noqa: E402


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="shepherd-ui-") as tmp:
        s = ui_server(Path(tmp)).start()
        flag = Path(tmp) / "go"
        drv = open_browser(width=1400, height=1300)
        try:
            ids = busy(s, flag)
            drv.get(s.url + "/ui")
            until(drv, "the pending job's reason", "const n = document.querySelector(arguments[0]); "
                  "return n && n.textContent", f"#queue tr[data-job='{ids['pending']}'] td.reason")
            wait_until_plots_are_shown(drv)
            out.parent.mkdir(parents=True, exist_ok=True)
            drv.save_screenshot(str(out))
        finally:
            drv.quit()
            flag.touch()
            s.stop()
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots" / "ui.png")
