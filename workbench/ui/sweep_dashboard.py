"""The sweep dashboard: one live band per grid point while a sweep runs in the background.

``start_sweep(slice, config, seeds=..., grid=...)`` shows a :class:`SweepDashboard` over a
sweep handle (:class:`workbench.engine.run.SweepRun`); ``run.wait()`` gives the
:class:`~workbench.engine.sweep.SweepResult` and leaves the final bands and a per-config
table in the cell. As with the training dashboard, the background thread only assigns
widget traits.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from workbench.engine.run import SweepRun
from workbench.ui.dashboard import StopControls
from workbench.ui.drawing import agg_figure, png_of

if TYPE_CHECKING:
    from workbench.engine import TrainConfig
    from workbench.engine.sweep import SweepResult


def _interval(stats: dict) -> str:
    if stats.get("iqm") is None:
        return "-"
    low, high = stats["iqm_ci"]
    return f"{stats['iqm']:.3g} [{low:.3g}, {high:.3g}]"


def configs_html(result: SweepResult) -> str:
    """Per grid point: trials, how many reached the target, and the IQM with its 95%
    bootstrap interval of the final return and of the time to target."""
    head = ("<tr><th style='text-align:left'>config</th><th>trials</th><th>reached target"
            "</th><th>final return, IQM [95% CI]</th><th>time to target s, IQM [95% CI]"
            "</th></tr>")
    rows = "".join(
        f"<tr><td style='text-align:left'>{html.escape(c['label'])}</td><td>{c['trials']}</td>"
        f"<td>{c['reached_target']}</td><td>{html.escape(_interval(c['final_return']))}</td>"
        f"<td>{html.escape(_interval(c['time_to_train_target_s']))}</td></tr>"
        for c in result.configs)
    return f"<table style='font-size:12px'>{head}{rows}</table>"


class SweepDashboard(StopControls, widgets.VBox):
    """Live bands of a sweep's trials (IQM and interquartile range per grid point), the
    trials' progress, and a Stop button."""

    def __init__(self, total_updates: int, configs: Sequence[dict], trials: Sequence[dict],
                 *, title: str = "Sweep", target_return: float | None = None,
                 redraw_s: float = 1.0) -> None:
        self.total_updates = max(1, int(total_updates))
        self.configs = list(configs)
        self.trials = {t["trial"]: {**t, "curve": []} for t in trials}
        self.target_return = target_return
        self.redraw_s = redraw_s
        self._drawn_at = 0.0
        self.title = widgets.HTML(f"<b>{html.escape(title)}</b>")
        self.progress = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                              description="updates", bar_style="info")
        self.stats = widgets.HTML("Starting: placing the chips' programs and compiling...")
        self.curves = widgets.Image(format="png")
        self._make_stop_controls()
        super().__init__([self.title, widgets.HBox([self.progress, self.stop_button]),
                          self.stats, self.curves, self.status])

    def update(self, trial: int, row: dict) -> None:
        """Show one update of one trial (the sweep's ``on_update``)."""
        curve = self.trials[trial]["curve"]
        del curve[row["update"] - 1:]  # a program run again sends its trials' updates anew
        curve.append(row)
        done = sum(len(t["curve"]) for t in self.trials.values())
        self.progress.value = min(1.0, done / (self.total_updates * len(self.trials)))
        recent = [t["curve"][-1].get("mean_return_100") for t in self.trials.values()
                  if t["curve"]]
        known = [r for r in recent if r is not None]
        self.stats.value = html.escape(
            f"{len(recent)} of {len(self.trials)} trials running; update {row['update']} of "
            f"{self.total_updates}; return (last 100 episodes) across trials: "
            + (f"{min(known):.3g} to {max(known):.3g}" if known else "-"))
        self._redraw_if_due()

    def figure_png(self, dpi: int = 90) -> bytes:
        from workbench.engine.sweep import draw_bands

        figure = agg_figure((7, 3.5))
        draw_bands(figure.subplots(), list(self.trials.values()), self.configs,
                   self.target_return)
        return png_of(figure, dpi)

    def finish(self, result: SweepResult | None, error: BaseException | None,
               stopped: bool) -> None:
        self.stop_button.disabled = True
        if error is not None:
            self.progress.bar_style = "danger"
            self.status.value = (f'<span style="color:#b00020">Sweep failed: '
                                 f"{html.escape(f'{type(error).__name__}: {error}')}</span>")
            return
        self.progress.bar_style = "warning" if stopped else "success"
        if result is not None:
            self.trials = {t["trial"]: t for t in result.trials}
            self.redraw()
            self.status.value = configs_html(result)


class DashboardSweep(SweepRun):
    """A :class:`~workbench.engine.run.SweepRun` watched by a :class:`SweepDashboard` built
    from its plan (its grid points, trials and target)."""

    def __init__(self, tpu_slice, config: TrainConfig, *, title: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(tpu_slice, config, **kwargs)
        plan = self.plan
        updates = config.num_updates(1 if config.mode == "anakin" else tpu_slice.num_chips)
        self.dashboard = SweepDashboard(
            updates, [{"config": p.index, "label": p.label()} for p in plan.points],
            [{"trial": t.index, "config": t.point.index, "seed": t.seed} for t in plan.trials],
            title=title or f"Sweep of {config.algo} on {config.env}: {len(plan.trials)} trials "
                           f"on {tpu_slice.shape.label}",
            target_return=plan.target_return)
        dashboard = self.dashboard
        dashboard.on_stop(self.stop)
        self.on_update(dashboard.update)
        self.on_stop(dashboard.show_stopping)
        self.on_end(lambda run: dashboard.finish(run.result, run.error, run.stopped))

    def wait(self, timeout_s: float | None = None, *, show_summary: bool = True,
             interrupt_grace_s: float = 30.0) -> SweepResult:
        """Block until the sweep ends; in a notebook, leave the bands and the per-config
        table in the cell."""
        result = super().wait(timeout_s, interrupt_grace_s=interrupt_grace_s)
        if show_summary:
            from IPython import get_ipython
            from IPython.display import HTML, Image, display

            if get_ipython() is not None:
                display(Image(data=self.dashboard.figure_png(dpi=100), format="png"))
                display(HTML(configs_html(result)))
        return result


def start_sweep(tpu_slice, config: TrainConfig | None = None, *, show: bool = True,
                title: str | None = None, **sweep_kwargs: Any) -> DashboardSweep:
    """Start a sweep on a reserved slice in the background, with a live dashboard.

    Args:
        tpu_slice: a reserved slice.
        config: the base run (``mode="anakin"`` vmaps the trials on the chips).
        show: display the dashboard in the current cell.
        title: the dashboard's heading.
        **sweep_kwargs: ``seeds``, ``grid``, ``poll_s``... as for
            :func:`workbench.engine.sweep.sweep`.

    Raises:
        ValueError: a sweep that cannot work (nothing is started).
    """
    from workbench.engine import TrainConfig

    run = DashboardSweep(tpu_slice, config or TrainConfig(mode="anakin"), title=title,
                         **sweep_kwargs)
    if show:
        from IPython.display import display

        display(run.dashboard)
    return run.start()
