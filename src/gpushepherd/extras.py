"""The optional parts of the install (design note 028): which commands need which extra.

The base install (``pip install gpushepherd``) is the client, the server and the
scheduling core. ``sim`` adds what ``shepherd simulate`` writes its tables with;
``report`` what ``report``, ``whatif``, ``simulate --html`` and the server's ``/ui``
plots need: pandas for the tables, plotly for the interactive HTML pages (note 040),
matplotlib for the ``/ui`` PNGs. A command checks the modules it uses only, so plotly
is imported only where a page is written. ``EXTRAS`` names the modules each extra installs (``pyproject.toml`` lists
the distributions; ``tests/test_install.py`` checks that the two agree).
"""

from __future__ import annotations

import importlib

#: extra -> the top-level modules it installs (import names, not distribution names)
#: (report: pandas for the tables, matplotlib for the /ui PNGs, plotly for the HTML pages)
EXTRAS: dict[str, tuple[str, ...]] = {
    "sim": ("pandas", "pyarrow"),
    "report": ("pandas", "matplotlib", "plotly"),
}


class MissingExtra(ImportError):
    """A command needs an extra that is not installed; the message names the command,
    the missing modules and the ``pip install`` line."""


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Import the modules of ``extra`` (a key of ``EXTRAS``) for ``what`` (a command,
    e.g. ``shepherd simulate``): nothing when they import. ``modules``: only these of
    the extra's (default: all of them).

    Raises:
        MissingExtra: one of them does not import (absent, or broken: the reason is
            named), e.g. ``shepherd simulate needs the 'sim' extra (pandas: No module
            named 'pandas'): pip install 'gpushepherd[sim]'``.
        KeyError: ``extra`` is not a key of ``EXTRAS``.
        ValueError: ``modules`` names a module the extra does not install.
    """
    if modules is not None and not set(modules) <= set(EXTRAS[extra]):
        raise ValueError(f"modules: {sorted(set(modules) - set(EXTRAS[extra]))} are not in the {extra!r} extra")
    missing = []
    for module in EXTRAS[extra] if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
    if missing:
        raise MissingExtra(f"{what} needs the {extra!r} extra ({'; '.join(missing)}): "
                           f"pip install 'gpushepherd[{extra}]'")
