"""What the verl adapter remembers in a process, kept per shared RewardModel in this normally imported module.

verl loads the adapter file (frameworks/verl/reward.py) by path (``custom_reward_function.path``), so a module-level
value there would exist once per load, outlive the model it belongs to and need clearing by hand. Here it
lives as long as its model (:func:`state_of`; :func:`keyshot.reward.shared.reset_shared` forgets both)
and is used on that model's own event loop only, so nothing here takes a lock around I/O:

- the one model verl's reward router serves, asked once per router address (samples of that address
  await the one request; other addresses are not held up; a failed request is forgotten, so the next
  sample asks again);
- which recorded rollout each sample scored, to warn once when every prompt's samples score the same one.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import weakref
from collections.abc import Hashable

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import PerProcess
from keyshot.reward.logs import warn_constant_groups
from keyshot.reward.model import RewardModel

#: How long the reward router may take to list its model.
ROUTER_TIMEOUT_S = 30.0
#: How many samples the constant-rollout check looks back over.
SEEN_SAMPLES = 4096
CONSTANT_FIX = (
    "Give each sample its own rollout: record an Episode per rollout (extra_info['episode']) or write "
    "each sample's trajectory folder into extra_info['trajectory'] from the agent loop, not a dataset column."
)


class RouterModelError(KeyshotError):
    """verl's reward router does not say which one model it serves."""


def router_url(address: str) -> str:
    """verl's ``host:port`` (or a URL) as an OpenAI base URL."""
    address = address.rstrip("/")
    if not address.startswith(("http://", "https://")):
        address = f"http://{address}"
    return address if address.endswith("/v1") else f"{address}/v1"


def listed_model(address: str) -> str:
    """The one model id the router at ``address`` lists at ``/v1/models`` (a blocking request).

    Raises :class:`RouterModelError` when it lists none or several (the scorer requests could not name
    the model), and ``OSError`` when the router does not answer.
    """
    url = router_url(address)
    with urllib.request.urlopen(f"{url}/models", timeout=ROUTER_TIMEOUT_S) as response:
        try:
            listed = json.load(response)
        except ValueError:
            raise RouterModelError(f"reward_router_address {address}: {url}/models is not JSON") from None
    ids = [
        m.get("id")
        for m in (listed.get("data") if isinstance(listed, dict) else None) or []
        if isinstance(m, dict) and m.get("id")
    ]
    if len(ids) != 1:
        raise RouterModelError(
            f"reward_router_address {address}: {url}/models lists {len(ids)} models {ids}; keyshot "
            "sends the scorer requests under the one model verl's reward model serves "
            "(reward.reward_model.model_path): serve exactly the keyshot scorer checkpoint there"
        )
    return ids[0]


class VerlState:
    """The adapter's memory for one RewardModel; every method runs on that model's loop."""

    def __init__(self, where: str):
        self.where = where
        self._routers: dict[str, asyncio.Future[str]] = {}
        self._seen: list[tuple[str, Hashable]] = []
        self._constant = False

    async def served_model(self, address: str) -> str:
        """:func:`listed_model` of ``address``, asked once: concurrent samples await the one request (in a
        thread: the loop goes on), a later one reads its answer; a failure is raised to the samples that
        awaited it and forgotten."""
        url = router_url(address)
        asked = self._routers.get(url)
        if asked is None:
            asked = asyncio.ensure_future(asyncio.to_thread(listed_model, address))
            self._routers[url] = asked

            def forget_failure(done: asyncio.Future[str]) -> None:
                if (done.cancelled() or done.exception() is not None) and self._routers.get(url) is done:
                    del self._routers[url]

            asked.add_done_callback(forget_failure)
        return await asyncio.shield(asked)  # one sample cancelled does not cancel the others' request

    def note_rollout(self, path: str, group: Hashable) -> None:
        """Record that a sample of ``group`` (its prompt) scored the recorded rollout at ``path``, and warn
        once when every prompt's samples score one rollout (a dataset column: equal rewards per group)."""
        if self._constant:
            return
        self._seen.append((path, group))
        del self._seen[:-SEEN_SAMPLES]
        paths, groups = zip(*self._seen, strict=True)
        self._constant = warn_constant_groups(list(paths), list(groups), self.where, CONSTANT_FIX)


#: Each model's state (its lock is held only to find or add one, never across I/O); a forked child starts
#: with none (the parent's models are unusable there)
_states: PerProcess[weakref.WeakKeyDictionary[RewardModel, VerlState]] = PerProcess(weakref.WeakKeyDictionary)


def state_of(model: RewardModel, where: str) -> VerlState:
    """The adapter's state for ``model`` (made on first use, gone with the model)."""
    with _states.lock:
        states = _states.items
        state = states.get(model)
        if state is None:
            state = states[model] = VerlState(where)
        return state
