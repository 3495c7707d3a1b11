"""Notebook views over the workbench API: the slice picker, the training and sweep
dashboards, and metrics recorded where a test can read them from an executed notebook."""

from workbench.ui.algorithm_picker import AlgorithmPicker
from workbench.ui.dashboard import DashboardRun, TrainingDashboard, start_training, summary_html
from workbench.ui.drawing import facts_html, slice_svg
from workbench.ui.picker import SlicePicker
from workbench.ui.records import METRICS_MIMETYPE, read_records, record
from workbench.ui.sweep_dashboard import DashboardSweep, SweepDashboard, start_sweep

__all__ = [
    "METRICS_MIMETYPE",
    "AlgorithmPicker",
    "DashboardRun",
    "DashboardSweep",
    "SlicePicker",
    "SweepDashboard",
    "TrainingDashboard",
    "facts_html",
    "read_records",
    "record",
    "slice_svg",
    "start_sweep",
    "start_training",
    "summary_html",
]
