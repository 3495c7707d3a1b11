"""A trained policy behind an HTTP endpoint, with Ray Serve on the cluster.

``serve_policy(run_dir)`` deploys the run's greedy policy: each replica builds the
algorithm's ``greedy`` once and answers ``POST /`` with JSON. Requests are checked
before they join a batch (a bad one gets a 4xx naming what was expected, and never fails
the others or the replica); good ones are batched (``@serve.batch``) into one forward
pass. The policy travels to the replicas with the deployment, so replicas need no shared
disk. HTTP listens on loopback unless told otherwise. Needs the ``serve`` extra.

Request and answer::

    {"observation": [0.1, 0.0, -0.2, 0.3]}           -> {"action": 1}
    {"observations": [[...], [...]]}                  -> {"actions": [1, 0]}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EXTRA = "pip install 'tpu-rl-workbench[serve]'"
MAX_BODY_BYTES = 1 << 20
"""Largest request body a replica reads (larger: 413)."""
MAX_BATCH_ROWS = 4096
"""Most observations in one request."""
APP_NAME = "workbench-policy"


class RequestError(ValueError):
    """A request the policy cannot answer; ``status`` is its HTTP code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, obs_shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """The observations a request body holds, checked against ``obs_shape``.

    Returns:
        ``[n, *obs_shape]`` float32 observations, and whether the request sent one
        (``"observation"``) rather than a list (``"observations"``).

    Raises:
        RequestError: 413 for a body over :data:`MAX_BODY_BYTES`; 400 for anything that is
            not a JSON object with one of those keys holding finite numbers of the shape.
    """
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"the body has {len(body)} bytes; at most {MAX_BODY_BYTES} "
                                "are read.")
    expected = (f'a JSON object {{"observation": <numbers of shape {list(obs_shape)}>}} or '
                f'{{"observations": [<such observations>, ...]}}')
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, f"the body is not JSON; send {expected}.") from None
    if not isinstance(payload, dict) or len(payload.keys() & {"observation",
                                                               "observations"}) != 1:
        raise RequestError(400, f"expected {expected}.")
    single = "observation" in payload
    value = payload["observation"] if single else payload["observations"]
    try:
        array = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        raise RequestError(400, f"the observation is not an array of numbers; send "
                                f"{expected}.") from None
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise RequestError(400, f"the observation is not an array of numbers; send {expected}.")
    batch = array[None] if single else array
    if batch.shape[1:] != tuple(obs_shape) or batch.ndim != len(obs_shape) + 1:
        got = f"{'shape' if single else 'a list of shape'} {list(array.shape)}"
        raise RequestError(400, f"an observation of shape {list(obs_shape)} was expected, got "
                                f"{got}.")
    if not 1 <= batch.shape[0] <= MAX_BATCH_ROWS:
        raise RequestError(400, f"send 1 to {MAX_BATCH_ROWS} observations, got "
                                f"{batch.shape[0]}.")
    if not np.all(np.isfinite(batch)):
        raise RequestError(400, "the observation holds NaN or infinity.")
    return batch.astype(np.float32), single


def plain(actions: np.ndarray) -> list:
    """Actions as JSON numbers (ints for discrete actions)."""
    return np.asarray(actions).tolist()


class PolicyReplica:
    """One Serve replica: the greedy policy, jitted on its CPU, and the batching."""

    def __init__(self, agent, params, obs_shape: tuple[int, ...]) -> None:
        import jax

        self.obs_shape = tuple(obs_shape)
        greedy = agent.build().greedy
        self._forward = jax.jit(lambda obs: greedy(params, obs))
        self._forward(np.zeros((1, *self.obs_shape), np.float32))  # compile before serving

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"error": f"the body is larger than {MAX_BODY_BYTES} bytes."},
                                status_code=413)
        if request.method != "POST":
            return JSONResponse({"error": "POST a JSON observation to this endpoint."},
                                status_code=405)
        try:
            observations, single = parse_request(await request.body(), self.obs_shape)
        except RequestError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        if single:
            return {"action": await self.act_one(observations[0])}
        return {"actions": plain(self._forward(observations))}

    async def act_one(self, observation: np.ndarray):
        return await self._batched(observation)

    def _act_batch(self, observations: list[np.ndarray]) -> list:
        return plain(self._forward(np.stack(observations)))


def _deployment(max_batch_size: int, batch_wait_timeout_s: float, replicas: int,
                actor_options: dict):
    from ray import serve

    class BatchedPolicy(PolicyReplica):
        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def _batched(self, observations: list[np.ndarray]) -> list:
            return self._act_batch(observations)

    return serve.deployment(
        BatchedPolicy, name="policy", num_replicas=replicas,
        max_ongoing_requests=max(2 * max_batch_size, 8),
        ray_actor_options=actor_options, graceful_shutdown_timeout_s=2.0,
        graceful_shutdown_wait_loop_s=0.5,
    )


@dataclass
class PolicyServer:
    """A deployed policy: ``url`` takes POSTs; :meth:`shutdown` removes everything."""

    url: str
    env: str
    obs_shape: tuple[int, ...]
    replicas: int
    _stopped: bool = False

    def shutdown(self) -> None:
        """Stop Serve (the app, its replicas, the HTTP proxy and the controller); idempotent."""
        if self._stopped:
            return
        from ray import serve

        serve.shutdown()
        self._stopped = True

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def check_serve_installed() -> None:
    """Raises ValueError naming the extra when Ray Serve's packages are missing."""
    import importlib.util

    missing = [m for m in ("starlette", "fastapi", "uvicorn") if importlib.util.find_spec(m)
               is None]
    if missing:
        raise ValueError(f"workbench serve needs Ray Serve's packages ({', '.join(missing)} "
                         f"missing): {EXTRA}.")


def serve_policy(run_dir: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
                 replicas: int = 1, tpu_slice=None, on_chip: bool = False,
                 max_batch_size: int = 64, batch_wait_timeout_s: float = 0.005
                 ) -> PolicyServer:
    """Deploy the greedy policy of a trained run with Ray Serve on the connected cluster.

    Args:
        run_dir: the run's folder (or its checkpoints).
        host: where HTTP listens (loopback by default).
        port: the HTTP port; a free one when None.
        replicas: how many replicas answer requests.
        tpu_slice: a reserved slice whose hosts the replicas run on (on their CPUs: the
            slice's chips stay in its placement group, for training).
        on_chip: each replica holds one free chip (the ``TPU`` resource, so Ray gives its
            process that chip alone) and runs the forward pass there; on the simulated
            cluster the chip is a CPU device, as for the learners.
        max_batch_size: most single-observation requests joined into one forward pass.
        batch_wait_timeout_s: how long a replica waits to fill a batch.

    Returns:
        The running :class:`PolicyServer`.

    Raises:
        CheckpointError: nothing usable in ``run_dir``.
        ValueError: bad arguments, or Ray Serve not installed (naming the extra).
    """
    from workbench.engine.loading import load

    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be a positive whole number, got {replicas!r}.")
    if not isinstance(max_batch_size, int) or not 1 <= max_batch_size <= MAX_BATCH_ROWS:
        raise ValueError(f"max_batch_size must be 1 to {MAX_BATCH_ROWS}, got "
                         f"{max_batch_size!r}.")
    if not (isinstance(batch_wait_timeout_s, (int, float))
            and math.isfinite(batch_wait_timeout_s) and batch_wait_timeout_s >= 0):
        raise ValueError(f"batch_wait_timeout_s must be a number >= 0, got "
                         f"{batch_wait_timeout_s!r}.")
    if not isinstance(on_chip, bool):
        raise ValueError(f"on_chip must be True or False, got {on_chip!r}.")
    if on_chip and tpu_slice is not None:
        raise ValueError(
            "on_chip replicas each hold a free chip, and a reserved slice keeps all of its "
            "chips in its placement group: serve on the slice's hosts (tpu_slice=..., "
            "on_chip=False), or release the slice and serve on its chips (on_chip=True "
            "without tpu_slice).")
    check_serve_installed()
    policy = load(run_dir)  # refuses a folder without a usable policy before Serve starts
    if on_chip:
        _check_free_chips(replicas)
    from ray import serve

    from workbench.tpu.ports import free_port

    port = port or free_port(host)
    actor_options: dict[str, Any] = {"num_cpus": 0,
                                     "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu"}}}
    if on_chip:
        # The host decides the platform (a TPU host's JAX finds its chip; the simulated
        # hosts say cpu), as for a learner.
        actor_options = {"num_cpus": 0, "resources": {"TPU": 1}}
    elif tpu_slice is not None:
        # On the slice's hosts, beside (not inside) its bundles, which the chips hold.
        actor_options["label_selector"] = {"ray.io/tpu-slice-name": tpu_slice.name}
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    try:
        app = _deployment(max_batch_size, batch_wait_timeout_s, replicas, actor_options).bind(
            policy.agent, policy.params, policy.spaces.obs_shape)
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    except BaseException:
        serve.shutdown()
        raise
    return PolicyServer(f"http://{host}:{port}/", policy.env, tuple(policy.spaces.obs_shape),
                        replicas)


def _check_free_chips(replicas: int) -> None:
    """Refuse, before Serve starts, replicas on chips the cluster does not have free: the
    deployment would wait for them forever."""
    from workbench.tpu.slice import list_slices

    free = sum(s.chips_free for s in list_slices())
    if free < replicas:
        raise ValueError(
            f"{replicas} replica(s) on a chip each need {replicas} free chip(s); the cluster "
            f"has {free} free (wb.list_slices() shows which slices are in use). Release a "
            "slice, ask for fewer replicas, or serve on CPUs without on_chip.")
