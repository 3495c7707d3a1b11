"""The slice picker: choose a TPU generation and topology, see what it is, reserve it.

A view over :mod:`workbench.tpu.catalog` and :mod:`workbench.tpu.slice`. Every button does one call
of the Python API that a cell can make too: ``picker.reserve()`` is the Reserve button,
``picker.release()`` the Release button, ``picker.select("v5p", "2x2x2")`` the dropdowns.
"""

from __future__ import annotations

import html
import logging
import sys
import threading
import time

import ipywidgets as widgets

from workbench.engine.config import TrainConfig
from workbench.engine.warm import start_learners
from workbench.tpu.catalog import (
    CatalogError,
    SliceShape,
    generation_names,
    parse_shape,
    topologies,
)
from workbench.tpu.cluster import ClusterError
from workbench.tpu.slice import Slice, SliceUnavailableError, list_slices, reserve
from workbench.ui.drawing import facts_html, slice_svg

log = logging.getLogger(__name__)

# What a user can cause from the picker; anything else is a bug and keeps its traceback.
USER_ERRORS = (CatalogError, SliceUnavailableError, ClusterError, ValueError, RuntimeError)
REFRESH_AGAIN_S = 2.0


def _ray_connected() -> bool:
    # Ray is heavy to import; if nothing imported it yet, this kernel is surely not connected.
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def _message(kind: str, text: str) -> str:
    colors = {"error": "#b00020", "ok": "#1b5e20", "busy": "#8a6d00", "info": "#333"}
    return f'<span style="color:{colors[kind]}">{html.escape(text)}</span>'


class SlicePicker(widgets.VBox):
    """Pick a TPU slice shape, see its facts and free capacity, reserve and release it.

    Display it as the last expression of a cell. The initial shape is validated by the
    catalog, so a papermill ``parameters`` cell can drive it.
    """

    def __init__(
        self,
        generation: str = "v6e",
        topology: str = "2x2",
        *,
        timeout_s: float = 60.0,
        cpus_per_chip: float = 2.0,
        config: TrainConfig | None = None,
    ) -> None:
        """Build the picker.

        Args:
            generation: initial TPU generation (aliases such as ``TPU-V6E`` accepted).
            topology: initial topology, valid for that generation.
            timeout_s: how long Reserve waits for a free slice.
            cpus_per_chip: host CPUs reserved with each chip (training needs 2).
            config: the run the next cells train. Where Reserve starts the slice's
                learners in the background (the simulated cluster), they and the rollout
                actors set up and compile this run (the defaults when None), so that its
                first update comes in seconds.

        Raises:
            CatalogError: the initial generation or topology is not in the catalog.
        """
        shape = parse_shape(generation, topology)
        self.timeout_s = timeout_s
        self.cpus_per_chip = cpus_per_chip
        self.config = config
        self._slice: Slice | None = None
        self._lock = threading.Lock()
        self._busy = False
        self._syncing = False
        self.generation_dropdown = widgets.Dropdown(
            options=generation_names(), value=shape.generation.name, description="Generation"
        )
        self.topology_dropdown = widgets.Dropdown(
            options=topologies(shape.generation.name),
            value=shape.topology,
            description="Topology",
        )
        self.facts = widgets.HTML()
        self.drawing = widgets.HTML()
        self.capacity = widgets.HTML()
        self.reserve_button = widgets.Button(description="Reserve", button_style="primary",
                                             icon="lock")
        self.release_button = widgets.Button(description="Release", icon="unlock",
                                             disabled=True)
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.status = widgets.HTML(_message("info", "No slice held."))
        self._shape = shape
        self.generation_dropdown.observe(self._on_generation, names="value")
        self.topology_dropdown.observe(self._on_topology, names="value")
        self.reserve_button.on_click(self._on_reserve_click)
        self.release_button.on_click(lambda _button: self._report(self.release))
        self.refresh_button.on_click(lambda _button: self.refresh())
        left = widgets.VBox([self.generation_dropdown, self.topology_dropdown, self.facts])
        super().__init__([
            widgets.HBox([left, self.drawing]),
            self.capacity,
            widgets.HBox([self.reserve_button, self.release_button, self.refresh_button]),
            self.status,
        ])
        self._show_shape()

    # -- what a cell can call -------------------------------------------------------------

    @property
    def shape(self) -> SliceShape:
        """The shape now selected."""
        return self._shape

    @property
    def slice(self) -> Slice | None:
        """The slice this picker holds, or None."""
        held = self._slice
        return held if held is not None and not held.released else None

    def select(self, generation: str, topology: str) -> SliceShape:
        """Select a shape, as choosing it in the dropdowns would.

        Args:
            generation: a TPU generation (aliases accepted).
            topology: a valid topology of that generation.

        Returns:
            The selected shape.

        Raises:
            CatalogError: the pair is not in the catalog (the selection is unchanged).
            RuntimeError: a slice is held; release it before choosing another shape.
        """
        try:
            shape = parse_shape(generation, topology)
            if self.slice is not None and shape != self._shape:
                raise RuntimeError(
                    f"This picker holds a {self.slice.shape.label} slice; release() it "
                    "before choosing another shape."
                )
        except USER_ERRORS as error:
            self._sync_dropdowns()  # show the shape still selected, not the refused one
            self._set_status("error", str(error))
            raise
        self._shape = shape
        self._sync_dropdowns()
        self._show_shape()
        return shape

    def free_slices(self) -> int | None:
        """How many intact, free slices of the selected shape the cluster has now.

        Returns:
            The count, or None when this process is not connected to a Ray cluster.
        """
        if not _ray_connected():
            return None
        return sum(1 for s in list_slices() if s.shape == self._shape and s.free)

    def refresh(self) -> int | None:
        """Re-read the cluster's free capacity for the selected shape and show it.

        Returns:
            As :meth:`free_slices`; None also when the cluster could not be read (the
            reason is shown in the widget).
        """
        if not _ray_connected():
            self.capacity.value = _message(
                "info", "Cluster: not connected (wb.connect(...) or wb.local_cluster(...)).")
            return None
        try:
            same = [s for s in list_slices() if s.shape == self._shape]
        except Exception as error:  # a cluster that went away must not break the widget
            self.capacity.value = _message("error", f"Could not read the cluster: {error}")
            return None
        free = sum(1 for s in same if s.free)
        self.capacity.value = _message(
            "ok" if free else "info",
            f"Cluster: {free} of {len(same)} {self._shape.label} slice(s) free now.",
        )
        return free

    def reserve(self) -> Slice:
        """Reserve a slice of the selected shape (what the Reserve button does).

        Returns:
            The reserved :class:`~workbench.tpu.slice.Slice`; also kept as :attr:`slice`.

        Raises:
            SliceUnavailableError: not connected, or no free slice within ``timeout_s``.
            CatalogError: a shape the catalog refuses.
            ValueError: a timeout or CPU count that is not a positive number.
            RuntimeError: this picker already holds a slice.
        """
        with self._lock:
            if self._busy:
                raise RuntimeError("A reservation is already in progress; wait for it.")
            self._busy = True
        self._set_buttons()
        shape = self._shape
        try:
            if self.slice is not None:
                raise RuntimeError(
                    f"This picker already holds {self.slice!r}; release() it first, or call "
                    "wb.reserve() for a second slice."
                )
            self._set_status(
                "busy", f"Reserving a {shape.label} slice (waiting up to {self.timeout_s:g} s)...")
            started = time.monotonic()
            held = reserve(shape.generation.name, shape.topology, timeout_s=self.timeout_s,
                           cpus_per_chip=self.cpus_per_chip)
            warming = ""
            if held.keep_learners:
                # The next cell's training then finds its learners started and joined.
                try:
                    start_learners(held, self.config)
                except BaseException:
                    held.release()  # a config that cannot work leaves nothing held
                    raise
                warming = " Its learners are starting in the background."
            self._set_status(
                "ok",
                f"Reserved {shape.label} slice {held.name}: {held.num_hosts} host(s) x "
                f"{shape.chips_per_host} chip(s), in {time.monotonic() - started:.1f} s."
                + warming,
            )
            self._slice = held
            return held
        except USER_ERRORS as error:
            self._set_status("error", str(error))
            raise
        finally:
            self._busy = False
            self._set_buttons()
            self._refresh_soon()

    def release(self) -> None:
        """Release the held slice (what the Release button does). Idempotent."""
        held = self._slice
        self._slice = None
        if held is not None and not held.released:
            held.release()
            self._set_status("ok", f"Released the {held.shape.label} slice {held.name}.")
        else:
            self._set_status("info", "No slice held.")
        self._set_buttons()
        self._refresh_soon()

    # -- widget plumbing ------------------------------------------------------------------

    def _refresh_soon(self) -> None:
        # Ray's view of free chips lags a reservation or release by a moment: show the
        # count now, and again once the cluster has caught up.
        self.refresh()
        timer = threading.Timer(REFRESH_AGAIN_S, self.refresh)
        timer.daemon = True
        timer.start()

    def _sync_dropdowns(self) -> None:
        # NOTE: new options reset a dropdown to its first entry and fire its observer; the
        # flag keeps those echoes of our own assignments from being taken as user choices.
        self._syncing = True
        try:
            self.generation_dropdown.value = self._shape.generation.name
            valid = topologies(self._shape.generation.name)
            if tuple(self.topology_dropdown.options) != valid:
                self.topology_dropdown.options = valid
            self.topology_dropdown.value = self._shape.topology
        finally:
            self._syncing = False

    def _show_shape(self) -> None:
        self.facts.value = facts_html(self._shape)
        self.drawing.value = slice_svg(self._shape)
        self.refresh()

    def _set_status(self, kind: str, text: str) -> None:
        self.status.value = _message(kind, text)

    def _set_buttons(self) -> None:
        holding = self.slice is not None
        self.reserve_button.disabled = holding or self._busy
        self.release_button.disabled = not holding or self._busy
        self.generation_dropdown.disabled = holding or self._busy
        self.topology_dropdown.disabled = holding or self._busy

    def _on_generation(self, change: dict) -> None:
        if self._syncing or change["new"] == self._shape.generation.name:
            return
        valid = topologies(change["new"])
        # Keep the topology when the new generation has it too (v5e <-> v6e).
        keep = self._shape.topology if self._shape.topology in valid else valid[0]
        self._report(self.select, change["new"], keep)

    def _on_topology(self, change: dict) -> None:
        if self._syncing or change["new"] is None or change["new"] == self._shape.topology:
            return
        self._report(self.select, self.generation_dropdown.value, change["new"])

    def _on_reserve_click(self, _button: widgets.Button) -> None:
        # NOTE: a click runs in the kernel's message loop; reserving there would freeze the
        # kernel for up to timeout_s, so it runs in a thread and reports by trait updates.
        threading.Thread(target=self._report, args=(self.reserve,), daemon=True).start()

    def _report(self, action, *args) -> None:
        """Run a button's action; a user error is already shown in the status line."""
        try:
            action(*args)
        except USER_ERRORS:
            log.debug("picker action failed", exc_info=True)
