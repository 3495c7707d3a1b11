"""The ``workbench`` command line; each subcommand is a thin call into the Python API.

``workbench train``'s (and ``workbench plan``'s) flags are derived from the configs: every field of
:class:`~workbench.engine.TrainConfig` and of the chosen algorithm's config dataclass is a
flag, with its docstring as help and its default. A run can also come from a YAML or JSON
file (``--config run.yaml``), which flags override.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from workbench.tpu.catalog import (
    CatalogError,
    SliceShape,
    all_shapes,
    parse_generation,
    parse_shape,
)
from workbench.tpu.cluster import ClusterError, parse_address
from workbench.tpu.slice import SliceUnavailableError

# Options of `workbench train` that say where a run goes, not what it learns.
SLICE_OPTIONS = ("generation", "topology")
# TrainConfig fields that are not flags: the algorithm's config gets flags of its own.
NOT_FLAGS = ("algo_config",)
CPUS_PER_CHIP = 2
"""Host CPUs reserved with each chip: its learner's, and room for a rollout actor (or an
RLlib env runner) beside it."""


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line that names the flag and what it takes, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}. `{self.prog} --help` lists every option.\n")


def _whole(minimum: int) -> Callable[[str], int]:
    """An argparse type for whole numbers of at least ``minimum``."""
    wanted = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- flags derived from config dataclasses ----------------------------------------------

def _field_type(info) -> Callable[[str], Any]:
    from workbench.engine.fields import ConfigError, parse_text

    def parse(text: str) -> Any:
        try:
            return parse_text(info, text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(error.problem.rstrip(".")) from None

    parse.__name__ = info.name
    return parse


def add_config_flags(parser: argparse.ArgumentParser, cls: type, dest_prefix: str,
                     skip: tuple[str, ...] = (), title: str | None = None) -> None:
    """A flag for every field of the config dataclass ``cls``, help from its docstrings.

    Flags default to "not given", so that a config file's values stand unless a flag
    overrides them; ``dest`` is ``<dest_prefix><field>``.
    """
    from workbench.engine.fields import fields

    group = parser.add_argument_group(title) if title else parser
    for info in fields(cls).values():
        if info.name in skip:
            continue
        shown = info.default if not isinstance(info.default, tuple) else \
            ",".join(str(v) for v in info.default)
        options: dict[str, Any] = {
            "dest": dest_prefix + info.name,
            "default": argparse.SUPPRESS,
            "help": f"{info.doc} (default: {shown})".replace("%", "%%"),
        }
        if info.kind == "bool":
            options["action"] = argparse.BooleanOptionalAction
        elif info.kind == "choice":
            options["choices"] = list(info.choices)
        elif info.kind != "other":
            options["type"] = _field_type(info)
            options["metavar"] = info.kind.upper()
        else:
            continue
        group.add_argument(info.flag, **options)


def _prescan(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` before the parser exists (``--flag V`` or
    ``--flag=V``), to pick which algorithm's flags to add."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _algorithm_for(argv: list[str]):
    """The algorithm whose flags ``workbench train`` offers: ``--algo``, else the config
    file's ``algo``, else the default. An unknown name is reported after parsing."""
    from workbench import algos
    from workbench.engine import TrainConfig

    name = _prescan(argv, "--algo")
    if name is None:
        path = _prescan(argv, "--config")
        if path:
            try:
                name = read_run_file(path).get("algo")
            except (OSError, ValueError):
                name = None
    try:
        return algos.get(name or TrainConfig().algo)
    except ValueError:
        return algos.get(TrainConfig().algo)


# ---- run files --------------------------------------------------------------------------

def read_run_file(path: str) -> dict:
    """A run given as a YAML or JSON mapping (parsed, never evaluated).

    Raises:
        ValueError: the file cannot be read, is not YAML/JSON, or is not a mapping.
    """
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--config {path}: cannot read it ({error.strerror}).") from None
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        loaded = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"--config {path}: not valid {kind} "
                         f"({str(error).splitlines()[0]}).") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"--config {path}: must hold a mapping of field: value, got "
                         f"{type(loaded).__name__}.")
    return loaded


def train_config_from(args: argparse.Namespace, algorithm) -> tuple[Any, SliceShape]:
    """The run's :class:`TrainConfig` and slice shape: defaults, then the ``--config``
    file, then flags.

    Raises:
        ValueError: an unknown key or a value of the wrong type (naming it), or a run
            file for another algorithm than ``--algo``.
    """
    from workbench.engine import TrainConfig
    from workbench.engine.fields import ConfigError, fields, from_mapping, unknown_field

    given = vars(args)
    from_file = read_run_file(args.config) if getattr(args, "config", None) else {}
    train_fields = fields(TrainConfig)
    values: dict[str, Any] = {}
    algo_values: dict[str, Any] = {}
    shape_values = {"generation": "v6e", "topology": "2x2"}
    for key, value in from_file.items():
        if key in SLICE_OPTIONS:
            shape_values[key] = value
        elif key in (algorithm.name, "algo_config"):
            if not isinstance(value, dict):
                raise ConfigError(key, f"in {args.config} must be a mapping of "
                                       f"{algorithm.name}'s fields, got {value!r}.")
            algo_values.update(value)
        elif key in train_fields and key not in NOT_FLAGS:
            values[key] = value
        else:
            raise unknown_field(TrainConfig, key, f"a run file (or {algorithm.name}'s section)")
    for name in train_fields:
        if f"train.{name}" in given:
            values[name] = given[f"train.{name}"]
    for name in SLICE_OPTIONS:
        if given.get(name) is not None:
            shape_values[name] = given[name]
    for key, value in given.items():
        if key.startswith("algo."):
            algo_values[key[len("algo."):]] = value
    if values.get("algo", algorithm.name) != algorithm.name:
        raise ValueError(
            f"The run file names algo {values['algo']!r} but --algo is {algorithm.name!r}; "
            "give one of them."
        )
    config = from_mapping(TrainConfig, values, "TrainConfig")
    hyperparameters = from_mapping(algorithm.config_type, algo_values,
                                   f"{algorithm.name}'s config")
    shape = parse_shape(shape_values["generation"], shape_values["topology"])
    return config.replace(algo=algorithm.name, algo_config=hyperparameters), shape


# ---- subcommands ------------------------------------------------------------------------

def cmd_topologies(args: argparse.Namespace) -> int:
    shapes = all_shapes()
    if args.generation:
        gen = parse_generation(args.generation)
        shapes = tuple(s for s in shapes if s.generation == gen)
    if args.json:
        print(json.dumps([s.describe() for s in shapes], indent=1))
        return 0
    rows = [["gen", "topology", "pod type", "chips", "hosts", "chips/host", "HBM/chip",
             "HBM total", "bf16 TF/chip", "bf16 TF total", "gke-tpu-accelerator",
             "gke-tpu-topology"]]
    for s in shapes:
        rows.append([
            s.generation.name, s.topology, s.pod_type, str(s.chips), str(s.hosts),
            str(s.chips_per_host), f"{s.generation.hbm_gib_per_chip:g} GiB",
            f"{s.hbm_gib:g} GiB", f"{s.generation.peak_bf16_tflops_per_chip:g}",
            f"{s.peak_bf16_tflops:g}", s.generation.gke_accelerator, s.topology,
        ])
    print(_table(rows))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from workbench.tpu.cluster import local_cluster
    from workbench.tpu.doctor import run_checks

    if args.mesh:
        return _doctor_mesh(args)
    cluster = local_cluster([("v6e", "2x2")]) if args.simulated else None
    try:
        findings = run_checks(args.address)
    finally:
        if cluster is not None:
            cluster.shutdown()
    for finding in findings:
        print(finding)
    return 1 if any(f.level == "error" for f in findings) else 0


def _doctor_mesh(args: argparse.Namespace) -> int:
    """Reserve the slice, join a learner per chip, print what each process got."""
    from workbench.engine.mesh_doctor import check_mesh
    from workbench.tpu.cluster import connect, local_cluster

    shape = parse_shape(args.generation, args.topology)  # refused before any cluster starts
    cluster = (local_cluster([(shape.generation.name, shape.topology)]) if args.simulated
               else None)
    try:
        if cluster is None:
            connect(_cluster_address(args))
        report = check_mesh(shape.generation.name, shape.topology, args.timeout)
    finally:
        if cluster is not None:
            cluster.shutdown()
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _cluster_address(args: argparse.Namespace) -> str | None:
    return getattr(args, "address", None) or os.environ.get("RAY_ADDRESS") or None


def _check_before_start(args: argparse.Namespace, config, shape: SliceShape):
    """Refuse, before any cluster starts, what would only fail once one is up."""
    from workbench.engine.plan import plan_run

    address = _cluster_address(args)
    if address:
        parse_address(address)
    plan = plan_run(config)
    if config.resume:
        from workbench.engine.checkpoint import require_checkpoint

        require_checkpoint(plan.checkpoint_dir)  # run_dir/checkpoints too
    json_path = getattr(args, "json", None)
    if json_path:
        _check_writable(json_path)
    return plan


def _check_writable(path: str, flag: str = "--json") -> None:
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name.")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: the folder {str(folder)!r} does not exist.")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable here; give a path you can write.")


def _run_training(args: argparse.Namespace, shape: SliceShape, make_run,
                  total_env_steps: int, resume_hint: str) -> tuple[dict, str]:
    """Reserve the slice (starting a simulated cluster if no address is known), run
    ``make_run(tpu_slice)`` with a progress bar, release; returns the result record and
    where it ran."""
    import contextlib

    from tqdm import tqdm

    from workbench.engine.stops import Terminated
    from workbench.tpu.cluster import join_or_start
    from workbench.tpu.slice import reserve

    with contextlib.ExitStack() as stack:
        if not _cluster_address(args):
            print(f"Starting a simulated cluster with one {shape.label} slice...",
                  file=sys.stderr)
        session = stack.enter_context(join_or_start(getattr(args, "address", None), [shape]))
        where = "over a simulated slice" if session.simulated else f"on {session.where}"
        tpu_slice = stack.enter_context(
            reserve(shape, timeout_s=args.reserve_timeout, cpus_per_chip=CPUS_PER_CHIP)
        )
        print(tpu_slice.layout(), file=sys.stderr)
        bar = stack.enter_context(
            tqdm(total=total_env_steps, unit="step", unit_scale=True, file=sys.stderr)
        )

        def progress(row: dict) -> None:
            bar.update(row["steps_this_update"])
            recent = row["mean_return_100"] or row["mean_return_this_update"] or 0.0
            bar.set_postfix(ret=f"{recent:.0f}", sps=f"{row['env_steps_per_s'] or 0:.0f}")

        run = make_run(tpu_slice).on_update(progress)
        print(f"Run folder: {run.run_dir}", file=sys.stderr)
        run.start()
        try:
            result = run.wait(interrupt_grace_s=10.0)
        except Terminated as terminated:
            terminated.resume_hint = resume_hint.format(run=run)
            raise
    return result.to_json(), where


def _train_jax(args: argparse.Namespace, config, shape: SliceShape) -> tuple[dict, str]:
    from workbench.engine.run import TrainingRun

    return _run_training(
        args, shape, lambda tpu_slice: TrainingRun(tpu_slice, config),
        config.total_env_steps,
        "workbench train --resume --checkpoint-dir {run.plan.checkpoint_dir} (and the same "
        "flags)")


def cmd_train(args: argparse.Namespace) -> int:
    from workbench import algos

    algorithm = algos.get(args.algo_name)
    config, shape = train_config_from(args, algorithm)
    _check_before_start(args, config, shape)
    if getattr(args, "check_fit", False):
        _check_fit(config, shape)
    record, _ = _train_jax(args, config, shape)
    summary = {k: v for k, v in record.items() if k != "curve"}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0


def _check_fit(config, shape: SliceShape) -> None:
    """Refuse, before any cluster starts, a run whose learner does not fit the slice's
    chips, compiled for the real TPU target (``--check-fit``; needs libtpu).

    Raises:
        ValueError: the run does not fit, naming the bytes needed and those a chip has.
        ImportError: libtpu is not installed, naming the extra.
    """
    from workbench.engine.fit import plan_fit_isolated

    print(f"Compiling the learner for {shape.pod_type} to check that it fits...",
          file=sys.stderr)
    report = plan_fit_isolated(shape, config)
    if not report.fits:
        raise ValueError(report.shortfall())


def cmd_plan(args: argparse.Namespace) -> int:
    """Compile the run's learner for the TPU slice, without one, and say whether it fits."""
    from workbench import algos
    from workbench.engine.fit import plan_fit
    from workbench.tpu.targets import TpuCompilerMissingError, libtpu_installed

    algorithm = algos.get(args.algo_name)
    config, shape = train_config_from(args, algorithm)
    if not libtpu_installed():
        raise TpuCompilerMissingError("workbench plan")
    import jax

    # This process only compiles: on a TPU host it must leave the chips (and libtpu's lock)
    # to the learners.
    jax.config.update("jax_platforms", "cpu")
    report = plan_fit(shape, config, layout=args.layout)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif report.fits:
        print(report.summary())
    if not report.fits:
        print(f"workbench: {report.shortfall()}", file=sys.stderr)
        return 1
    return 0


def _plan_options(parser: argparse.ArgumentParser, algorithm) -> None:
    """``plan``'s options: the slice, and the run's fields as ``train`` takes them."""
    parser.add_argument("--generation", help="TPU generation (default: v6e)")
    parser.add_argument("--topology", help="slice topology (default: 2x2)")
    parser.add_argument("--layout", choices=["chip", "host"], default="chip",
                        help="JAX processes per chip (chip, how runs place learners) or per "
                             "host: the compiled programs are the same (default: chip)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    _run_options(parser, algorithm)


def cmd_train_rllib(args: argparse.Namespace) -> int:
    from workbench.engine.rllib import RLlibOptions, RLlibRun
    from workbench.engine.rllib.algorithms import rllib_config
    from workbench.engine.rllib.placement import check_fits, learner_count
    from workbench.engine.rllib.run import require_torch
    from workbench.tpu.cluster import parse_address

    # Everything a user can get wrong is refused before a cluster starts.
    require_torch()
    shape = parse_shape(args.generation or "v6e", args.topology or "2x2")
    settings = tuple(args.set or ())
    if not any(text.strip().startswith("num_env_runners=") for text in settings):
        settings = (f"num_env_runners={shape.chips}", *settings)  # one beside each learner
    config = rllib_config(args.algo_name, args.env, seed=args.seed, settings=settings)
    config.learners(num_learners=args.learners or shape.chips)
    check_fits(config, shape.chips, CPUS_PER_CHIP, learner_count(config, shape.chips))
    options = RLlibOptions(total_env_steps=args.total_env_steps,
                           target_return=args.target_return,
                           checkpoint_every=args.checkpoint_every, run_dir=args.run_dir)
    if _cluster_address(args):
        parse_address(_cluster_address(args))
    if args.json:
        _check_writable(args.json)
    record, _ = _run_training(
        args, shape, lambda tpu_slice: RLlibRun(tpu_slice, config, options),
        options.total_env_steps,
        "workbench train --engine rllib --run-dir {run.run_dir} (and the same flags)")
    print(json.dumps({k: v for k, v in record.items() if k != "curve"}, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0


def _rllib_train_options(parser: argparse.ArgumentParser) -> None:
    from workbench.engine.rllib.algorithms import ONLINE
    from workbench.engine.rllib.run import RLlibOptions

    defaults = RLlibOptions()
    parser.add_argument("--engine", choices=["jax", "rllib"], default="rllib")
    parser.add_argument("--algo", dest="algo_name", default="PPO",
                        help=f"RLlib's algorithm: one of {', '.join(ONLINE)} (default: PPO)")
    parser.add_argument("--env", default="CartPole-v1", help="a gymnasium id")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="one of the algorithm's training settings, or num_env_runners "
                             "(default: 1 per chip); repeat for more")
    parser.add_argument("--learners", type=_whole(1),
                        help="RLlib learners, one per chip (default: every chip of the slice)")
    parser.add_argument("--seed", type=_whole(0), default=0)
    parser.add_argument("--total-env-steps", type=_whole(1), default=defaults.total_env_steps)
    parser.add_argument("--target-return", type=float,
                        help="stop once RLlib's episode_return_mean reaches this")
    parser.add_argument("--checkpoint-every", type=_whole(1),
                        default=defaults.checkpoint_every, help="iterations between checkpoints")
    parser.add_argument("--run-dir", help="the run's folder; one holding a checkpoint resumes")
    _slice_options(parser)


def cmd_demo(args: argparse.Namespace) -> int:
    from workbench.engine import TrainConfig

    shape = parse_shape(args.generation, args.topology)
    config = TrainConfig(total_env_steps=args.total_env_steps, seed=args.seed,
                         stop_at_target=True)
    _check_before_start(args, config, shape)
    started = time.monotonic()
    record, where = _train_jax(args, config, shape)
    print(
        f"PPO on {record['env']} {where} ({record['generation']} {record['topology']}, "
        f"{record['chips']} learners on {record['hosts']} host(s)): greedy return "
        f"{record['final_return']:.1f} after {record['env_steps']} env steps; "
        f"training-target time {record['time_to_train_target_s']} s, "
        f"start-up {record['startup_s']:.1f} s, all done in {time.monotonic() - started:.0f} s."
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import contextlib

    from tqdm import tqdm

    from workbench import algos
    from workbench.engine.run import SweepRun
    from workbench.engine.sweep_plan import parse_grid_text
    from workbench.tpu.cluster import join_or_start
    from workbench.tpu.slice import reserve

    algorithm = algos.get(args.algo_name)
    config, shape = train_config_from(args, algorithm)
    grid = parse_grid_text(args.grid or [], config)
    _check_before_start(args, config, shape)
    with contextlib.ExitStack() as stack:
        if not _cluster_address(args):
            print(f"Starting a simulated cluster with one {shape.label} slice...",
                  file=sys.stderr)
        session = stack.enter_context(join_or_start(getattr(args, "address", None), [shape]))
        tpu_slice = stack.enter_context(
            reserve(shape, timeout_s=args.reserve_timeout, cpus_per_chip=CPUS_PER_CHIP))
        run = SweepRun(tpu_slice, config, seeds=args.seeds, grid=grid)
        trials = len(run.plan.trials)
        updates = config.num_updates(1 if config.mode == "anakin" else shape.chips)
        bar = stack.enter_context(tqdm(total=trials * updates, unit="update", file=sys.stderr))
        run.on_update(lambda trial, row: bar.update(1))
        print(f"{trials} trials of {config.algo} on {config.env} "
              f"({len(run.plan.points)} configs x {len(run.plan.seeds)} seeds) "
              f"{'over a simulated slice' if session.simulated else 'on ' + session.where}; "
              f"folder {run.plan.run_dir}", file=sys.stderr)
        result = run.start().wait(interrupt_grace_s=30.0)
    record = result.to_json()
    print(json.dumps({"run_dir": record["run_dir"], "programs": record["programs"],
                      "startup_s": record["startup_s"], "wall_s": record["wall_s"],
                      "env_steps_per_s": record["env_steps_per_s"],
                      "configs": [{k: c[k] for k in ("label", "trials", "reached_target",
                                                     "final_return")}
                                  for c in record["configs"]]}, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from workbench.engine.playback import evaluate_run

    if args.gif:
        _check_writable(args.gif, "--gif")
    if args.json:
        _check_writable(args.json)
    record = evaluate_run(args.run_dir, episodes=args.episodes, seed=args.seed, gif=args.gif)
    print(f"{record['env']}: {record['episodes']} greedy episodes of {record['algo']} "
          f"(update {record['update']}, {record['env_steps']} env steps): mean return "
          f"{record['mean_return']:.2f}" + (f"; GIF in {record['gif']}" if record["gif"]
                                            else ""))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from workbench.engine.loading import load
    from workbench.engine.serving import check_serve_installed, serve_policy
    from workbench.tpu.cluster import join_or_start

    check_serve_installed()
    load(args.run_dir)  # nothing usable there: refused before a cluster starts
    done = threading.Event()
    with join_or_start(getattr(args, "address", None), []) as session:
        server = serve_policy(args.run_dir, host=args.host, port=args.port,
                              replicas=args.replicas, on_chip=args.on_chip,
                              max_batch_size=args.max_batch_size)
        try:
            # Installed only now: ray.init puts its own SIGTERM handler in place.
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, lambda *_: done.set())
            print(f"Serving {server.env}'s policy at {server.url} ({server.replicas} "
                  f"replica(s) on {session.where}); POST {{\"observation\": [...]}}. "
                  "Ctrl-C stops it.", file=sys.stderr, flush=True)
            done.wait()
        finally:
            server.shutdown()
    print("workbench: the policy server stopped.", file=sys.stderr)
    return 0


def _slice_options(parser: argparse.ArgumentParser) -> None:
    """Where a training command runs: the slice, the cluster, and its record's file."""
    parser.add_argument("--generation", help="TPU generation (default: v6e)")
    parser.add_argument("--topology", help="slice topology (default: 2x2)")
    parser.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else simulated)")
    parser.add_argument("--json", help="write the result record here")
    parser.add_argument("--reserve-timeout", type=_seconds, default=60.0)


def _sweep_and_train_options(parser: argparse.ArgumentParser, algorithm) -> None:
    """The options ``train`` and ``sweep`` share: the slice, the cluster, the run's config
    (a file and a flag per field) and the algorithm's fields."""
    _slice_options(parser)
    _run_options(parser, algorithm)


def _run_options(parser: argparse.ArgumentParser, algorithm) -> None:
    """The run's config as flags: a file, a flag per ``TrainConfig`` field, the algorithm
    and a flag per field of its config (``train``, ``sweep`` and ``plan`` take them)."""
    from workbench import algos
    from workbench.engine import TrainConfig

    parser.add_argument("--config", help="a YAML or JSON file of the run's fields")
    add_config_flags(parser, TrainConfig, "train.", skip=NOT_FLAGS + ("algo",))
    parser.add_argument("--algo", dest="algo_name", default=algorithm.name,
                        help=f"the algorithm: one of {', '.join(algos.names())} "
                             "(default: ppo)")
    add_config_flags(parser, algorithm.config_type, "algo.",
                     title=f"{algorithm.name} ({algorithm.summary or 'hyperparameters'})")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``argv`` picks which algorithm's flags ``train`` offers."""
    import workbench

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(
        prog="workbench", description="Reinforcement learning on Cloud TPU slices with Ray and JAX."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--version", action="version",
                        version=f"workbench {workbench.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    topo = sub.add_parser("topologies", help="list TPU generations and valid slice shapes")
    topo.add_argument("--generation", help="only this generation (v4, v5e, v5p, v6e, v7x)")
    topo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    topo.set_defaults(func=cmd_topologies)

    doctor = sub.add_parser("doctor", help="pre-flight checks of this process and the cluster")
    doctor.add_argument("--address", help="Ray address (default: RAY_ADDRESS)")
    doctor.add_argument("--simulated", action="store_true",
                        help="check a freshly started simulated cluster instead")
    doctor.add_argument("--mesh", action="store_true",
                        help="reserve a slice, start a learner per chip and check that they "
                             "form one mesh: each process's TPU environment, devices, "
                             "process index and a psum over every chip")
    doctor.add_argument("--generation", default="v6e", help="the slice --mesh checks")
    doctor.add_argument("--topology", default="2x2", help="the slice --mesh checks")
    doctor.add_argument("--timeout", type=float, default=120.0,
                        help="seconds --mesh waits for the learners to join")
    doctor.set_defaults(func=cmd_doctor)

    demo = sub.add_parser("demo", help="PPO on CartPole on an embedded simulated slice")
    demo.add_argument("--generation", default="v6e")
    demo.add_argument("--topology", default="2x2")
    demo.add_argument("--total-env-steps", type=_whole(1), default=500_000)
    demo.add_argument("--seed", type=_whole(0), default=0)
    demo.add_argument("--reserve-timeout", type=_seconds, default=60.0)
    demo.set_defaults(func=cmd_demo)

    algorithm = _algorithm_for(argv)
    if _prescan(argv, "--engine") == "rllib":
        run = sub.add_parser(
            "train", help="train on a reserved slice (simulated if no address)",
            description="Train one of RLlib's algorithms on a reserved slice: one RLlib "
                        "learner per chip, env runners on the hosts' CPUs.")
        _rllib_train_options(run)
        run.set_defaults(func=cmd_train_rllib)
    else:
        run = sub.add_parser(
            "train", help="train on a reserved slice (simulated if no address)",
            description="Train on a reserved slice. Every TrainConfig field and every field "
                        "of the chosen algorithm's config is a flag; --config takes a YAML or "
                        "JSON file of the same fields, which flags override. --engine rllib "
                        "trains RLlib's algorithms instead (see --engine rllib --help).")
        run.add_argument("--engine", choices=["jax", "rllib"], default="jax",
                         help="jax: the workbench's own learners (default); rllib: RLlib's")
        run.add_argument("--check-fit", action="store_true",
                         help="first compile the learner for the TPU slice (needs libtpu: "
                              "pip install 'tpu-rl-workbench[tpu]') and refuse a run that "
                              "does not fit its chips' HBM, before any cluster starts")
        _sweep_and_train_options(run, algorithm)
        run.set_defaults(func=cmd_train)

    plan = sub.add_parser(
        "plan", help="compile a run's learner for a TPU slice without one: does it fit?",
        description="Plan a run as train would and compile its learner's programs for the "
                    "TPU slice with libtpu (pip install 'tpu-rl-workbench[tpu]'), on any "
                    "machine: HBM per chip against the chip's, and one update's FLOPs, bytes "
                    "and roofline time. Takes train's flags; no cluster starts.")
    _plan_options(plan, algorithm)
    plan.set_defaults(func=cmd_plan)

    sweep = sub.add_parser(
        "sweep", help="many seeds and a grid of hyperparameters in one program",
        description="Train every seed of every grid point on one reserved slice. In "
                    "--mode anakin the trials run side by side in one compiled program per "
                    "chip; in actors mode they are queued. The run's flags are train's.",
    )
    sweep.add_argument("--seeds", default="0-7",
                       help="seeds: a range 0-63, a list 0,1,2, or both (default: 0-7)")
    sweep.add_argument("--grid", action="append", metavar="FIELD=V1,V2",
                       help="a field of the algorithm (ppo.learning_rate) or of the run, and "
                            "its values; repeat for more axes")
    _sweep_and_train_options(sweep, algorithm)
    sweep.set_defaults(func=cmd_sweep)

    evaluate = sub.add_parser("eval", help="greedy episodes of a trained run's policy")
    evaluate.add_argument("run_dir", help="the run's folder (or its checkpoints)")
    evaluate.add_argument("--episodes", type=_whole(1), default=100)
    evaluate.add_argument("--seed", type=_whole(0), default=0)
    evaluate.add_argument("--gif", help="draw one episode into this GIF")
    evaluate.add_argument("--json", help="write the returns here")
    evaluate.set_defaults(func=cmd_eval)

    serve = sub.add_parser("serve", help="an HTTP endpoint for a trained run's policy "
                                         "(Ray Serve)")
    serve.add_argument("run_dir", help="the run's folder (or its checkpoints)")
    serve.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else local)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="where HTTP listens (default: loopback only)")
    serve.add_argument("--port", type=_whole(1), default=8000)
    serve.add_argument("--replicas", type=_whole(1), default=1)
    serve.add_argument("--on-chip", action="store_true",
                       help="each replica holds a free chip and runs the policy there")
    serve.add_argument("--max-batch-size", type=_whole(1), default=64,
                       help="single-observation requests joined into one forward pass")
    serve.set_defaults(func=cmd_serve)

    from workbench.tpu import gke

    gke.add_parser(sub)
    return parser


def _one_line(error: BaseException, flags: set[str]) -> str:
    """The error as one line; a config field's error also names its flag."""
    from workbench.engine.fields import ConfigError

    if (isinstance(error, ConfigError) and error.field in flags
            and not error.problem.startswith("=")):
        return f"{error.field} (--{error.field.replace('_', '-')}) {error.problem}"
    return " ".join(str(error).split())


def _flag_fields(argv: list[str]) -> set[str]:
    """The config fields that ``workbench train`` offers as flags for this command line."""
    from workbench.engine import TrainConfig
    from workbench.engine.fields import fields

    if _prescan(argv, "--engine") == "rllib":
        return set()
    return (set(fields(TrainConfig)) | set(fields(_algorithm_for(argv).config_type))) - \
        set(NOT_FLAGS)


def main(argv: list[str] | None = None) -> int:
    from workbench.engine.restarts import ChipLost
    from workbench.engine.stops import Terminated, handle_termination
    from workbench.learn.joined_mesh import MeshMismatchError
    from workbench.learn.platform import DistributedStartError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    # SIGTERM (a pod evicted, a CI timeout) and SIGHUP stop training after its current
    # update with a checkpoint, release the slice, and end the command with a message.
    handle_termination(raise_in_main=True)
    try:
        return args.func(args)
    except Terminated as terminated:
        hint = getattr(terminated, "resume_hint", None)
        resume = f" Resume with: {hint}." if hint else ""
        print(f"workbench: {terminated}: training stopped after its current update, with a "
              f"checkpoint, and the slice was released.{resume}", file=sys.stderr)
        return 128 + terminated.signum
    except (CatalogError, ValueError, ClusterError, SliceUnavailableError,
            DistributedStartError, MeshMismatchError, ChipLost, ImportError) as error:
        print(f"workbench: {_one_line(error, _flag_fields(argv))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted: training stopped after its current update (with a "
              "final checkpoint when --checkpoint-dir is set) and the slice was released.",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
