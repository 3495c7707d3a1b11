"""What the connected Ray cluster holds now: its placement groups and live actors, read
from the GCS. Tests compare these before and after to show that nothing was left behind."""

from __future__ import annotations

import ray


def live_placement_groups() -> list[str]:
    """The ids of every placement group not yet removed."""
    table = ray.util.placement_group_table()
    return [pg_id for pg_id, pg in table.items() if pg["state"] != "REMOVED"]


def live_actors() -> list[str]:
    """The ids of every live actor."""
    return list(live_actor_names())


def live_actor_names() -> dict[str, str]:
    """Every live actor's id and its name ("" for an unnamed one)."""
    return {actor_id: a.get("Name", "") for actor_id, a in live_actor_records().items()}


def live_actor_records() -> dict[str, dict]:
    """Every live actor's record in the GCS actor table (name, class, pid...), by id."""
    # The GCS actor table: the state API proper needs the dashboard, which the simulated
    # cluster leaves off to save memory.
    from ray._private.state import actors

    return {actor_id: a for actor_id, a in actors().items() if a["State"] != "DEAD"}
