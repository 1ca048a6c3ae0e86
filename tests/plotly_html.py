"""Reading back the interactive pages (note 040): the plotly figures a page draws, as the
JSON it hands to ``Plotly.newPlot``, and the checks that a page is self-contained."""

from __future__ import annotations

import json
import re


def figures(page: str) -> dict[str, dict]:
    """``div id -> {"data": [...], "layout": {...}}`` of every ``Plotly.newPlot`` call
    in ``page`` (the spec plotly.io.to_html writes)."""
    dec = json.JSONDecoder()
    out = {}
    for m in re.finditer(r"Plotly\.newPlot\(\s*", page):
        i = m.end()
        div_id, i = dec.raw_decode(page, i)
        specs = []
        for _ in range(2):
            i = re.compile(r"\s*,\s*").match(page, i).end()
            spec, i = dec.raw_decode(page, i)
            specs.append(spec)
        out[div_id] = {"data": specs[0], "layout": specs[1]}
    return out


def assert_self_contained(page: str) -> None:
    """Nothing is fetched at view time: no script, stylesheet, image or frame with a
    source, plotly.js inlined once, and plotly's CDN not named in a tag."""
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, flags=re.I)
    assert not [t for t in tags if re.search(r"\b(?:src|href)\s*=", t, flags=re.I)], tags
    assert page.count("<script") >= 2  # the bundle and at least one figure
    assert "Plotly.newPlot" in page and page.count("plotly.js v") >= 1  # the bundle's own banner
    assert "cdn.plot.ly/plotly" not in re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)


def axis_title(layout: dict, axis: str) -> str:
    """The title text of ``xaxis`` / ``yaxis`` in a figure's layout."""
    title = layout.get(axis, {}).get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title)


#: JavaScript: once plotly has drawn every figure of the page, ``[id, width, height,
#: [legend texts]]`` of each; until then false
DRAWN = ("const d = [...document.querySelectorAll('div.js-plotly-plot')]; "
         "return d.length && d.every(x => x.querySelectorAll('.cartesianlayer g.trace').length) "
         "&& d.map(x => [x.id, x.offsetWidth, x.offsetHeight, "
         "[...x.querySelectorAll('.legendtext')].map(t => t.textContent)]);")


def drawn_in_chromium(path, capsys, shot: str) -> list:
    """Open the page ``path`` in a headless Chromium (``tests/test_ui.py``), wait until
    plotly has drawn every figure, save a screenshot ``shot`` beside it; ``DRAWN``'s list."""
    from test_ui import open_browser, save_shot, until

    drv = open_browser(1200, 2400)
    try:
        drv.get(path.resolve().as_uri())
        figs = until(drv, "the plots drawn", DRAWN)
        save_shot(drv, path.parent, shot, capsys)
        return figs
    finally:
        drv.quit()
