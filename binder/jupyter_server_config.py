"""Jupyter server settings for the labs (`make lab` and Binder put this folder on
JUPYTER_CONFIG_PATH): a lab reopened after its kernel stopped shows each widget's picture.

A kvlab widget's output carries its live view (a reference to a widget model that lives
in the kernel) and a static picture (``image/png``). JupyterLab saves the view but not the
model, so a lab reopened after its kernel has stopped shows "Error displaying widget:
model not found" in every widget cell. Saving the models too (jupyterlab-manager's
``saveState``) helps once only: JupyterLab 4 drops the restored models at the next save
(ipywidgets issue 3888). So when a notebook is opened and no kernel runs for it, the
server hands JupyterLab each such output without its view, and JupyterLab shows the
picture. While the notebook's kernel runs (a page reload, a tab closed and opened again)
the views stay and the widgets come back live from the kernel. The file on disk is not
rewritten here; it loses the views only when the reopened lab is saved.
What this leaves out: views whose model state is saved in the notebook are kept, and an
output with no picture to stand in for its view keeps the view (and the error).
"""

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PICTURES = ("image/png", "image/svg+xml")


def drop_views_without_models(notebook: dict) -> None:
    """Drop each widget view whose model is not saved in ``notebook`` and whose output has
    a picture to show instead."""
    widgets = notebook.get("metadata", {}).get("widgets", {})
    saved = widgets.get(WIDGET_STATE, {}).get("state", {})
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            view = data.get(WIDGET_VIEW)
            if view is None or view.get("model_id") in saved:
                continue
            if any(mimetype in data for mimetype in PICTURES):
                del data[WIDGET_VIEW]


class PicturesWithoutKernel(AsyncLargeFileManager):
    """JupyterLab's own contents manager, but a notebook opened while no kernel runs for it
    comes without the widget views that kernel's models would have drawn."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model["type"] == "notebook" and model.get("content"):
            sessions = self.parent.session_manager
            if not await sessions.session_exists(path=model["path"]):
                drop_views_without_models(model["content"])
        return model


c = get_config()  # noqa: F821 (defined by the config loader)
c.ServerApp.contents_manager_class = PicturesWithoutKernel
