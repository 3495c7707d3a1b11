"""The training dashboard: live curves of a run that trains in the background.

``start_training(slice, config)`` shows a :class:`TrainingDashboard` over a run handle
(:class:`workbench.engine.run.TrainingRun`, training in a thread, so the kernel stays free to
handle the Stop button); ``run.wait()`` gives the :class:`~workbench.engine.TrainResult`. The
dashboard only observes the run and forwards its Stop button to ``run.stop()``.

NOTE: the training thread updates widgets only by assigning traits (values, PNG bytes);
ipywidgets sends those from any thread, whereas an ``Output`` context manager used across
threads would send output to whichever cell happens to be running.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from workbench.engine.rllib import RLlibOptions, RLlibRun, is_rllib_config
from workbench.engine.run import TrainingRun
from workbench.ui.drawing import agg_figure, png_of

if TYPE_CHECKING:
    from workbench.engine import TrainConfig, TrainResult
    from workbench.tpu.slice import Slice

log = logging.getLogger(__name__)

# Result fields shown in the summary table, in this order, with their labels.
SUMMARY_FIELDS = (
    ("engine", "engine"),
    ("generation", "generation"),
    ("topology", "topology"),
    ("chips", "chips"),
    ("hosts", "hosts"),
    ("mode", "mode"),
    ("algo", "algorithm"),
    ("sync", "sync"),
    ("env", "environment"),
    ("seed", "seed"),
    ("updates", "updates"),
    ("env_steps", "env steps"),
    ("wall_s", "training loop (s)"),
    ("env_steps_per_s", "env steps / s"),
    ("final_return", "final greedy return"),
    ("time_to_train_target_s", "time to training target (s)"),
    ("time_to_eval_target_s", "time to greedy-eval target (s)"),
    ("startup_s", "start-up (s)"),
    ("checkpoint", "last checkpoint"),
)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def final_return_label(result: TrainResult) -> str:
    """What a result's ``final_return`` is: the JAX engine's greedy evaluation, or RLlib's
    mean return of its latest training episodes."""
    return "final greedy return" if result.engine == "jax" else \
        "final return (RLlib's episode_return_mean)"


def summary_html(result: TrainResult, stopped: bool = False) -> str:
    """A run's result as a two-column HTML table.

    Args:
        result: what :func:`workbench.engine.train` returned.
        stopped: the run was stopped before its budget; said in the caption.

    Returns:
        An HTML ``<table>`` string.
    """
    record = result.to_json()
    caption = "Training stopped early" if stopped else "Training finished"
    rows = "".join(
        f'<tr><td style="padding:1px 10px 1px 0;text-align:left">{label}</td>'
        f'<td style="text-align:right">{html.escape(_fmt(record.get(key)))}</td></tr>'
        for key, label in ((k, final_return_label(result) if k == "final_return" else label)
                           for k, label in SUMMARY_FIELDS)
        if key in record
    )
    return (
        f'<table style="font-size:12px"><caption style="text-align:left">'
        f"<b>{caption}</b></caption>{rows}</table>"
    )


class StopControls:
    """A dashboard's Stop button and status line (a click calls every ``on_stop`` callback,
    each of which must return at once), and its throttled redraw of ``figure_png()``."""

    def _make_stop_controls(self) -> None:
        self._stop_callbacks: list[Callable[[], None]] = []
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="danger")
        self.status = widgets.HTML()
        self.stop_button.on_click(lambda _button: self._request_stop())

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when Stop is clicked (it must return at once)."""
        self._stop_callbacks.append(callback)

    def _request_stop(self) -> None:
        self.show_stopping()
        for callback in self._stop_callbacks:
            callback()

    def show_stopping(self) -> None:
        """Show that the run was asked to stop."""
        self.stop_button.disabled = True
        self.status.value = "Stopping after the current update..."

    def _redraw_if_due(self) -> None:
        if time.monotonic() - self._drawn_at >= self.redraw_s:
            self.redraw()

    def redraw(self) -> None:
        """Render the curves now (PNG into the image widget)."""
        self._drawn_at = time.monotonic()
        self.curves.value = self.figure_png()


class TrainingDashboard(StopControls, widgets.VBox):
    """Live view of one training run: return curves, throughput, progress, chip times, Stop.

    Feed it the engine's per-update rows with :meth:`update` (from any thread); the Stop
    button calls the functions registered with :meth:`on_stop`.
    """

    def __init__(
        self,
        total_env_steps: int,
        *,
        title: str = "Training",
        target_return: float | None = None,
        redraw_s: float = 1.0,
    ) -> None:
        """Build the dashboard.

        Args:
            total_env_steps: the run's budget; the progress bar's end.
            title: shown above the curves.
            target_return: drawn as a dashed line on the return curve, if given.
            redraw_s: at least this many seconds between two renders of the curves.

        Raises:
            ValueError: ``total_env_steps`` or ``redraw_s`` is not positive.
        """
        if isinstance(total_env_steps, bool) or not isinstance(total_env_steps, int) or (
            total_env_steps <= 0
        ):
            raise ValueError(
                f"total_env_steps must be a positive whole number, got {total_env_steps!r}.")
        if not isinstance(redraw_s, (int, float)) or redraw_s <= 0:
            raise ValueError(f"redraw_s must be a positive number of seconds, got {redraw_s!r}.")
        self.total_env_steps = total_env_steps
        self.target_return = target_return
        self.redraw_s = float(redraw_s)
        self.rows: list[dict] = []
        self._drawn_at = 0.0
        self.title = widgets.HTML(f"<b>{html.escape(title)}</b>")
        self.progress = widgets.FloatProgress(
            value=0.0, min=0.0, max=float(total_env_steps), description="env steps",
            bar_style="info",
        )
        self.progress_text = widgets.Label(f"0 / {total_env_steps:,}")
        self.stats = widgets.HTML("Starting: placing actors, joining chips, compiling...")
        self.curves = widgets.Image(format="png")
        self._make_stop_controls()
        super().__init__([
            self.title,
            widgets.HBox([self.progress, self.progress_text, self.stop_button]),
            self.stats,
            self.curves,
            self.status,
        ])

    def update(self, row: dict) -> None:
        """Show one update's row (the engine's ``on_update`` argument).

        Args:
            row: a dict with at least ``env_steps``; ``mean_return_100``,
                ``mean_return_this_update``, ``env_steps_per_s``, ``chip_step_s`` are
                shown when present.
        """
        self.rows.append(row)
        steps = int(row.get("env_steps") or 0)
        self.progress.value = float(min(steps, self.total_env_steps))
        self.progress_text.value = f"{steps:,} / {self.total_env_steps:,}"
        rate = row.get("env_steps_per_s")
        recent = row.get("mean_return_100")
        this = row.get("mean_return_this_update")
        chip_s = row.get("chip_step_s") or []
        parts = [
            f"update {row.get('update', len(self.rows))}",
            f"{_fmt(rate)} env steps/s",
            f"return (last 100 episodes) {_fmt(recent)}",
            f"return (this update) {_fmt(this)}",
        ]
        if chip_s:
            parts.append(
                f"chip step {1000 * min(chip_s):.1f}-{1000 * max(chip_s):.1f} ms "
                f"over {len(chip_s)} chips"
            )
        self.stats.value = " &middot; ".join(html.escape(p) for p in parts)
        self._redraw_if_due()

    def figure_png(self, dpi: int = 90) -> bytes:
        """The curves as PNG bytes: returns over env steps, and the last per-chip step times.

        Args:
            dpi: resolution of the image.

        Returns:
            The PNG file's bytes.
        """
        figure = agg_figure((9, 3))
        returns, chips = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
        steps = [r.get("env_steps", 0) for r in self.rows]
        for key, label, style in (
            ("mean_return_this_update", "this update", {"alpha": 0.45, "lw": 1}),
            ("mean_return_100", "last 100 episodes", {"lw": 2}),
        ):
            points = [(s, r.get(key)) for s, r in zip(steps, self.rows, strict=True)
                      if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                returns.plot(xs, ys, label=label, **style)
        if self.target_return is not None:
            returns.axhline(self.target_return, color="gray", ls="--", lw=1, label="target")
        returns.set_xlabel("env steps")
        returns.set_ylabel("episode return")
        returns.set_xlim(0, max([self.total_env_steps, *steps]))
        if returns.get_legend_handles_labels()[0]:
            returns.legend(loc="upper left", fontsize=8)
        last = self.rows[-1].get("chip_step_s") if self.rows else None
        if last:
            chips.bar(range(len(last)), [1000 * s for s in last], color="#3f7fd9")
            chips.set_xticks(range(len(last)))
        chips.set_xlabel("chip")
        chips.set_ylabel("step time (ms)")
        chips.set_title("last update", fontsize=9)
        return png_of(figure, dpi)

    def finish(self, result: TrainResult | None, error: BaseException | None,
               stopped: bool) -> None:
        """Show the end of the run: its result, or the error that ended it."""
        self.stop_button.disabled = True
        if self.rows:
            self.redraw()
        if error is not None:
            self.progress.bar_style = "danger"
            self.status.value = (
                f'<span style="color:#b00020">Training failed: '
                f"{html.escape(f'{type(error).__name__}: {error}')}</span>"
            )
            return
        self.progress.bar_style = "warning" if stopped else "success"
        if result is not None:
            if not stopped:
                self.progress.value = self.progress.max
            self.status.value = html.escape(
                f"{'Stopped' if stopped else 'Done'}: {result.env_steps:,} env steps in "
                f"{result.wall_s:.1f} s, {result.env_steps_per_s:,.0f} env steps/s, "
                f"{final_return_label(result)} {result.final_return:.1f}."
            )


class _Watched:
    """A run handle watched by a :class:`TrainingDashboard`; its :meth:`wait` also leaves a
    static figure and a summary table in the cell."""

    def _watch(self, dashboard: TrainingDashboard) -> None:
        self.dashboard = dashboard
        self._summarised = False
        dashboard.on_stop(self.stop)
        self.on_update(dashboard.update)
        self.on_stop(dashboard.show_stopping)
        self.on_end(lambda run: dashboard.finish(run.result, run.error, run.stopped))

    def wait(self, timeout_s: float | None = None, *, show_summary: bool = True,
             interrupt_grace_s: float = 30.0) -> TrainResult:
        """Block until training ends and return its result (see
        :meth:`TrainingRun.wait <workbench.engine.run.TrainingRun.wait>`).

        Args:
            timeout_s: give up waiting after this long (training goes on).
            show_summary: in a notebook, leave a static figure and a summary table in
                this cell's output (they stay in saved and papermill-executed notebooks).
            interrupt_grace_s: how long an interrupted wait gives training to end.
        """
        result = super().wait(timeout_s, interrupt_grace_s=interrupt_grace_s)
        if show_summary and not self._summarised:
            self._summarised = True
            _show_summary(self.dashboard, result, self.stopped)
        return result


class DashboardRun(_Watched, TrainingRun):
    """A :class:`~workbench.engine.run.TrainingRun` watched by a :class:`TrainingDashboard`."""

    def __init__(self, tpu_slice: Slice, config: TrainConfig | None, dashboard: TrainingDashboard,
                 **kwargs: Any) -> None:
        super().__init__(tpu_slice, config, **kwargs)
        self._watch(dashboard)


class RLlibDashboardRun(_Watched, RLlibRun):
    """An :class:`~workbench.engine.rllib.RLlibRun` watched by a :class:`TrainingDashboard`."""

    def __init__(self, tpu_slice: Slice, config, dashboard: TrainingDashboard,
                 options: RLlibOptions | None = None, **kwargs: Any) -> None:
        super().__init__(tpu_slice, config, options, **kwargs)
        self._watch(dashboard)


def _show_summary(dashboard: TrainingDashboard, result: TrainResult, stopped: bool) -> None:
    from IPython import get_ipython
    from IPython.display import HTML, Image, display

    if get_ipython() is None:
        return  # plain Python: the caller has the result object
    display(Image(data=dashboard.figure_png(dpi=100), format="png"))
    display(HTML(summary_html(result, stopped)))


def start_training(
    tpu_slice: Slice,
    config: TrainConfig | None = None,
    *,
    show: bool = True,
    release_slice: bool = False,
    title: str | None = None,
    rllib_options: RLlibOptions | None = None,
    **train_kwargs: Any,
) -> DashboardRun | RLlibDashboardRun:
    """Start training on a reserved slice in the background, with a live dashboard.

    Returns at once; the kernel stays free, so the dashboard's Stop button works. Call
    ``run.wait()`` for the result.

    Args:
        tpu_slice: a reserved slice (``picker.reserve()`` or ``wb.reserve(...)``).
        config: what to learn; the engine's default when None. An RLlib
            ``AlgorithmConfig`` trains on the RLlib engine.
        show: display the dashboard in the current cell.
        release_slice: release the slice when training ends (finished, stopped or failed).
        title: the dashboard's heading; by default the shape and environment.
        rllib_options: an RLlib run's budget, target and folder
            (:class:`~workbench.engine.rllib.RLlibOptions`).
        **train_kwargs: passed on to :func:`workbench.engine.driver.train`.

    Returns:
        The running :class:`DashboardRun` (or :class:`RLlibDashboardRun`).

    Raises:
        ValueError: a config that cannot work, or a released slice (nothing is started).
    """
    from workbench.engine import TrainConfig

    if is_rllib_config(config):
        if train_kwargs:
            raise ValueError(f"An RLlib run takes no {', '.join(sorted(train_kwargs))}; its "
                             "budget and folder go in rllib_options=wb.RLlibOptions(...).")
        options = rllib_options or RLlibOptions()
        dashboard = TrainingDashboard(
            options.total_env_steps,
            title=title or f"RLlib {config.algo_class.__name__} on {config.env} on "
                           f"{tpu_slice.shape.label} ({tpu_slice.num_chips} chips)")
        run: DashboardRun | RLlibDashboardRun = RLlibDashboardRun(
            tpu_slice, config, dashboard, options, release_slice=release_slice)
    else:
        if rllib_options is not None:
            raise ValueError("rllib_options is for an RLlib AlgorithmConfig; this run's "
                             "budget is its TrainConfig's total_env_steps.")
        config = config or TrainConfig()
        dashboard = TrainingDashboard(
            config.total_env_steps if isinstance(config.total_env_steps, int) else 1,
            title=title or f"{config.env} on {tpu_slice.shape.label} "
                           f"({tpu_slice.num_chips} chips, {config.algo}, seed {config.seed})",
        )
        run = DashboardRun(tpu_slice, config, dashboard, release_slice=release_slice,
                           **train_kwargs)
    # Only an env with a target gets a target line.
    dashboard.target_return = run.target_return
    if show:
        from IPython.display import display

        display(dashboard)
    return run.start()
