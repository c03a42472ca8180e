"""Progress and reprs in Jupyter: a notebook executed by a real IPython kernel (nbclient).

The kernel is a ZMQInteractiveShell, as in Jupyter: ``progress`` draws an HTML table
without blocking and updates it in place, and ``Client``/``LocalCluster`` show HTML.
"""

from __future__ import annotations

import nbclient  # the test extra installs nbclient and ipykernel
import nbformat

CELLS = [
    """from apportion import Client, LocalCluster, progress
cluster = LocalCluster(workers=[{"name": "gpu-a", "nthreads": 2, "resources": {"GPU": 1}}],
                       http_port=0)
client = Client(cluster)
client""",
    "cluster",
    """import time
def train(step):
    time.sleep(0.05)
    return step
futures = client.map(train, range(12), resources={"GPU": 1})
bars = progress(futures)      # in Jupyter: returns at once, draws and updates a table
print("returned before done:", not all(f.done() for f in futures))""",
    """assert bars.wait(60)
bars""",
    "client.close(); cluster.close()",
]


def html_of(output: dict) -> str:
    return str(output.get("data", {}).get("text/html", ""))


def test_progress_and_reprs_in_a_jupyter_kernel() -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    client_out, cluster_out, progress_out, final_out, _ = (c.outputs for c in notebook.cells)

    client_html = html_of(client_out[-1])
    assert "Client" in client_html and "GPU" in client_html and "dashboard" in client_html
    assert "gpu-a" in html_of(cluster_out[-1])
    # The bars were displayed once, as an HTML table, when the cell had already returned
    # with tasks still running, and updated in place to the final count (nbclient applies
    # the kernel's updates of a display to the output it recorded).
    (shown,) = [o for o in progress_out if o["output_type"] == "display_data"]
    assert "apportion-progress" in html_of(shown) and "12/12" in html_of(shown)
    printed = "".join(o.get("text", "") for o in progress_out if o["output_type"] == "stream")
    assert "returned before done: True" in printed
    final = html_of(final_out[-1])
    assert "apportion-progress" in final and "train" in final and "12" in final
