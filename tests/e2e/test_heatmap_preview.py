"""The topology page draws the rack heatmap on a canvas as soon as its JSON arrives, before Plotly's
4.6 MB bundle (preloaded meanwhile) is run; the interactive chart replaces it. Plotly's download is held
back here (the route is answered only when the test says so), so the preview is the only thing that can
be seen."""

import pytest

from tests.cycle.helpers import running
from tests.e2e.conftest import log_in, shot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

COUNT_COLOR = """([r, g, b]) => {
  const canvas = document.querySelector('#heatmap canvas.hm-preview');
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let count = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i] === r && data[i + 1] === g && data[i + 2] === b && data[i + 3] === 255) count++;
  }
  return count;
}"""


def test_it_shows_the_rack_heatmap_before_plotly_has_loaded(stack, browser, cluster, olivia):
    base, _logs = stack
    running(cluster.queue_b, "holder", list(cluster.nodes[0].devices.all()), cluster.h100)  # r1: 4 of 8 busy
    page = log_in(browser, base, "olivia")
    held = []
    released = []

    def hold_back(route):
        if released:
            route.continue_()
        else:
            held.append(route)

    page.route("**/vendor/plotly.min.js", hold_back)
    page.goto(f"{base}/topology/", wait_until="commit")
    page.wait_for_selector("#heatmap canvas.hm-preview[data-cells='2']")
    assert page.evaluate("typeof window.Plotly") == "undefined"
    assert held, "Plotly's bundle was requested and is held back"
    assert page.inner_text("#rack-summary").startswith("2 racks · busy 4 · free 12")
    assert page.locator("#heatmap .main-svg").count() == 0
    # Busy share on Plotly's scale from #f2f4f7 (0) to #1849a9 (1): r1 at 0.5, r2 at 0.
    assert page.evaluate(COUNT_COLOR, [133, 159, 208]) > 100
    assert page.evaluate(COUNT_COLOR, [242, 244, 247]) > 100
    shot(page, "08-topology-preview")

    page.select_option("#metric", "free")  # redrawn as a preview too: r2 wholly free (#475467)
    page.wait_for_function(f"() => ({COUNT_COLOR})([71, 84, 103]) > 100")

    released.append(True)
    for route in held:  # the preload's request (the script's, if it does not reuse it, is let through)
        route.continue_()
    page.wait_for_selector("#heatmap .main-svg")
    assert page.locator("#heatmap canvas.hm-preview").count() == 0
    assert page.evaluate("document.getElementById('heatmap').data[0].type") == "heatmap"
