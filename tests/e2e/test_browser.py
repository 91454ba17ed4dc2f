"""Browser tests: what an operator sees in the Dagster UI and the MLflow registry UI.

Headless Chromium (Debian's `chromium` package) loads the real UIs, served by a real
`dagster-webserver -m assets.definitions` and a real `mlflow server` (fixtures in
conftest.py), and the assertions read the rendered DOM. The expected asset keys come
from `assets.definitions.defs`, so the test follows the code location.

Pages:
  * Dagster global asset lineage graph, `/asset-groups?expanded=<every group>`: the
    graph an operator looks at. Groups are collapsed by default (then the DOM holds only
    group names), so the URL expands them all; the asset names are then read from the
    graph's node boxes (SVG <foreignObject>s), not from the sidebar or the nav.
    (Node boxes also show kinds, status, etc. at some zoom levels, so extra text is allowed here.)
  * Dagster asset catalog, `/assets`: one link `/assets/<key>` per asset, the full key,
    never truncated (the graph middle-truncates very long names); here the set must be exact,
    so an asset in the UI that the code location does not define fails too.
  * MLflow registry, `/#/models/acme.concise`: the version table, where the alias shows
    as a tag `@ champion` in the version's row.
Screenshots and page text land in the module's tmp folder (`e2e*/<page>.png|.txt`).
"""

from __future__ import annotations

import json
import warnings

import pytest

pytestmark = pytest.mark.slow

# the repository and location names `dagster-webserver -m assets.definitions` gives a Definitions
REPOSITORY, LOCATION = "__repository__", "assets.definitions"


def code_location_assets() -> tuple[list[list[str]], list[str]]:
    """(asset key paths, group names) of the code location, from `assets.definitions.defs`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from assets.definitions import defs

        graph = defs.resolve_asset_graph()
        keys = sorted(graph.get_all_asset_keys())
        return [list(k.path) for k in keys], sorted({graph.get(k).group_name for k in keys})


def test_code_location_has_assets():
    keys, groups = code_location_assets()
    assert keys and groups  # the browser tests below would prove nothing on an empty location


def test_asset_graph_shows_every_asset(dagster_ui, browser):
    keys, groups = code_location_assets()
    expected = [path[-1] for path in keys]  # a node shows the last part of its key
    # A group's id in the graph is `global@global:<group>`, or `<repo>@<location>:<group>` with
    # the per-code-location grouping flag on; unknown ids are ignored, so pass both forms.
    expanded = ",".join(x for g in groups for x in (f"global@global:{g}", f"{REPOSITORY}@{LOCATION}:{g}"))
    probe = """Array.from(document.querySelectorAll('svg foreignObject'))
                 .flatMap(fo => fo.firstElementChild ? fo.firstElementChild.innerText.split('\\n') : [])
                 .map(s => s.trim()).filter(Boolean)"""
    r = browser.visit(f"{dagster_ui}/asset-groups?expanded={expanded}", probe,
                      lambda labels: labels is not None and set(expected) <= set(labels), "dagster-asset-graph")
    labels = set(r["value"] or [])
    missing = [k for k in expected if k not in labels]
    assert not missing, (f"asset graph lacks node(s) {missing}; graph labels {sorted(labels)}; "
                         f"screenshot {r['screenshot']}")


def test_asset_catalog_lists_every_asset(dagster_ui, browser):
    keys, _ = code_location_assets()
    expected = ["/".join(path) for path in keys]  # the link is /assets/<part>/<part>...
    probe = """Array.from(document.querySelectorAll('a[href^="/assets/"]'))
                 .map(a => [decodeURIComponent(a.getAttribute('href').slice(8)), a.innerText])"""

    def listed(links):
        return {href.rstrip("/"): text for href, text in links or []}

    r = browser.visit(f"{dagster_ui}/assets", probe, lambda v: set(expected) <= set(listed(v)), "dagster-asset-catalog")
    links = listed(r["value"])
    missing = [k for k in expected if k not in links]
    assert not missing, f"asset catalog lacks {missing}; it links {sorted(links)}; screenshot {r['screenshot']}"
    extra = set(links) - set(expected)
    assert not extra, f"asset catalog lists {sorted(extra)} not in assets.definitions; {r['screenshot']}"
    for k in expected:  # the link shows the key's name, not just points at it
        assert k.split("/")[-1] in links[k], (k, links[k])


def test_registry_page_shows_champion_alias(mlflow_ui, browser):
    url, name, version = mlflow_ui
    # the version table's rows (\s also folds the tag's "@&nbsp;champion"), and the page text
    probe = """({rows: Array.from(document.querySelectorAll('[role=row]'))
                      .map(r => r.innerText.replace(/\\s+/g, ' ').trim()),
                 text: document.body.innerText})"""

    def champion_row(v):
        rows = (v or {}).get("rows") or []
        return next((r for r in rows if r.startswith(f"Version {version} ") and "@ champion" in r), None)

    r = browser.visit(f"{url}/#/models/{name}", probe, champion_row, "mlflow-model")
    assert name in r["text"], f"model page does not name {name}; screenshot {r['screenshot']}"
    row = champion_row(r["value"])
    assert row, (f"no row 'Version {version} ... @ champion' on the model page; rows "
                 f"{json.dumps((r['value'] or {}).get('rows'))}; screenshot {r['screenshot']}")
