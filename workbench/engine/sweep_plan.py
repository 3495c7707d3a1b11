"""What a sweep will run, decided on the driver before anything starts: the grid's points,
the trials (every point with every seed), which trials share one compiled program, and
whether a chip's memory holds its share. A sweep that cannot work is refused here, naming
the field, the value or the limit."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.engine.config import MAX_SEED, TrainConfig
from workbench.engine.fields import ConfigError, coerce, fields, parse_text, unknown_field

MAX_TRIALS = 4096


@dataclass(frozen=True)
class GridPoint:
    """One combination of the grid's values, and the run config it makes."""

    index: int
    overrides: tuple[tuple[str, Any], ...]
    """``("ppo.learning_rate", 0.001)``-style pairs, in the grid's order."""
    config: TrainConfig

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.overrides) or "base config"


@dataclass(frozen=True)
class Trial:
    index: int
    point: GridPoint
    seed: int


@dataclass(frozen=True)
class ProgramGroup:
    """Trials that run as one compiled program (Anakin mode): their configs differ only in
    ``traced_fields``, which the program takes as values."""

    trials: tuple[Trial, ...]
    traced_fields: tuple[str, ...]


def parse_seeds(seeds: str | int | Iterable[int]) -> tuple[int, ...]:
    """Seeds from ``"0-63"``, ``"0,3,7"``, ``"0-3,10"``, an int count or an iterable.

    Raises:
        ConfigError: a seed that is no whole number in 0..2**31-1, a repeat, or none.
    """
    if isinstance(seeds, str):
        found: list[int] = []
        for part in seeds.split(","):
            part = part.strip()
            low, dash, high = part.partition("-")
            try:
                span = range(int(low), int(high) + 1) if dash else [int(part)]
            except ValueError:
                raise ConfigError("seeds", f"must be like 0-63 or 0,1,2, got {seeds!r}.") from None
            found.extend(span)
    elif isinstance(seeds, int) and not isinstance(seeds, bool):
        found = list(range(seeds))
    else:
        found = list(seeds)
    if not found:
        raise ConfigError("seeds", f"must name at least one seed, got {seeds!r}.")
    for seed in found:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ConfigError("seeds", f"must be whole numbers from 0 to {MAX_SEED}, got "
                                       f"{seed!r}.")
    if len(set(found)) != len(found):
        raise ConfigError("seeds", f"names a seed twice: {seeds!r}.")
    return tuple(found)


def parse_grid_text(items: Sequence[str], config: TrainConfig) -> dict[str, list]:
    """``["ppo.learning_rate=1e-3,5e-4", "gamma=0.99,0.999"]`` as a grid mapping, each
    value parsed by its field's type (never evaluated).

    Raises:
        ConfigError: not ``field=v1,v2``, an unknown field, or a value of the wrong type.
    """
    grid: dict[str, list] = {}
    for item in items:
        name, equals, values = item.partition("=")
        if not equals or not values.strip():
            raise ConfigError("grid", f"entries are field=value,value..., got {item!r}.")
        owner, info, _ = resolve_field(name.strip(), config)
        parts = [values] if info.kind in ("ints", "strs", "mapping") else values.split(",")
        grid[name.strip()] = [parse_text(info, part.strip()) for part in parts]
        del owner
    return grid


def resolve_field(name: str, config: TrainConfig):
    """``(owner, FieldInfo, plain name)`` for a grid key: ``"<algo>.<field>"`` or a field of
    the algorithm's config (``owner == "algo"``), else a field of ``TrainConfig``.

    Raises:
        ConfigError: no such field, naming the nearest.
    """
    algorithm = config.algorithm()
    algo_fields = fields(algorithm.config_type)
    prefix, dot, rest = name.partition(".")
    if dot:
        if prefix != algorithm.name:
            raise ConfigError(name, f"names algorithm {prefix!r}, but this sweep trains "
                                    f"{algorithm.name!r}: write {algorithm.name}.{rest}.")
        if rest not in algo_fields:
            raise unknown_field(algorithm.config_type, rest, f"{algorithm.name}'s config")
        return "algo", algo_fields[rest], rest
    if name in algo_fields:
        return "algo", algo_fields[name], name
    train_fields = fields(TrainConfig)
    if name in ("seed", "algo", "algo_config", "mode"):
        raise ConfigError(name, "cannot be swept: seeds are given apart (--seeds), and a "
                                "sweep trains one algorithm in one mode.")
    if name not in train_fields:
        raise unknown_field(TrainConfig, name, f"TrainConfig or {algorithm.name}'s config")
    return "train", train_fields[name], name


def grid_points(config: TrainConfig, grid: Mapping[str, Sequence[Any]] | None) -> list[GridPoint]:
    """Every combination of the grid's values applied to ``config`` (validated).

    Raises:
        ConfigError: an unknown field, a value of the wrong type or out of range (naming
            the grid point), or an axis with no values.
    """
    grid = dict(grid or {})
    base_algo = config.hyperparameters()
    resolved = []
    for name, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ConfigError(name, f"needs a list of values to sweep, got {values!r}.")
        owner, info, plain = resolve_field(name, config)
        resolved.append((name, owner, info, plain, [coerce(info, v) for v in values]))
    points = []
    for index, combo in enumerate(itertools.product(*[r[4] for r in resolved])):
        algo_changes, train_changes, overrides = {}, {}, []
        for (name, owner, _, plain, _), value in zip(resolved, combo, strict=True):
            (algo_changes if owner == "algo" else train_changes)[plain] = value
            overrides.append((name, value))
        point_config = config.replace(
            algo_config=dataclasses.replace(base_algo, **algo_changes), **train_changes)
        try:
            point_config.validate()
        except ValueError as error:
            where = ", ".join(f"{k}={v}" for k, v in overrides)
            raise ConfigError("grid", f"point {where}: {error}") from None
        points.append(GridPoint(index, tuple(overrides), point_config))
    return points


def trials_of(points: Sequence[GridPoint], seeds: Sequence[int]) -> list[Trial]:
    trials = [Trial(i, point, seed) for i, (point, seed) in
              enumerate((p, s) for p in points for s in seeds)]
    if len(trials) > MAX_TRIALS:
        raise ConfigError("seeds", f"and the grid make {len(trials)} trials; a sweep runs at "
                                   f"most {MAX_TRIALS}: sweep fewer seeds or values.")
    return trials


def group_trials(trials: Sequence[Trial], grid_fields: Sequence[str]) -> list[ProgramGroup]:
    """Trials by compiled program: a swept float of the algorithm's config is a value the
    program takes; any other swept field makes a program of its own."""
    if not trials:
        return []
    config = trials[0].point.config
    traced = []
    for name in grid_fields:
        owner, info, plain = resolve_field(name, config)
        if owner == "algo" and info.kind == "float":
            traced.append(plain)
    groups: dict[tuple, list[Trial]] = {}
    for trial in trials:
        algo = dataclasses.replace(trial.point.config.hyperparameters(),
                                   **{f: 0.0 for f in traced})
        key = (repr(algo), repr(trial.point.config.replace(algo_config=None, seed=0)))
        groups.setdefault(key, []).append(trial)
    return [ProgramGroup(tuple(g), tuple(traced)) for g in groups.values()]
