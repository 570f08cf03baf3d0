"""keyshot's observation on OpenEnv's own serialisation path, in the OpenEnv venv (run by
tests/reward/test_openenv_rubric.py): a 1280x720 screenshot held as ``Pixels`` in keyshot's ``PixelObservation`` against
the same page as nested lists in OpenEnv's ``BrowserGymObservation``, both through OpenEnv's
``serialize_observation`` and ``WSObservationResponse.model_dump_json`` (what its WebSocket handler sends),
then read back by OpenEnv's ``BrowserGymEnv`` client.

Prints one JSON object: the two texts equal, what the client read equal to the array, the memory each
dumped answer keeps (OpenEnv's handler keeps it until the session's next message), and seconds to encode.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
from browsergym_env.client import BrowserGymEnv
from browsergym_env.models import BrowserGymObservation
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import WSObservationResponse

from keyshot.frameworks.openenv.rubric import screenshot_of
from keyshot.frameworks.openenv.server import PixelObservation
from keyshot.frameworks.openenv.wire import Pixels

FIELDS = dict(text="t", url="u", goal="g", axtree_txt="t", pruned_html="<p>x</p>", error="")


def kept_and_text(observation) -> tuple[float, str, float]:
    """MiB the dumped answer keeps, its JSON text, seconds to build the text."""
    tracemalloc.start()
    answer = WSObservationResponse(data=serialize_observation(observation))
    kept = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    started = time.perf_counter()
    text = answer.model_dump_json()
    return kept, text, time.perf_counter() - started


def main() -> None:
    array = np.random.default_rng(0).integers(0, 256, size=(720, 1280, 3), dtype=np.uint8)
    ours = PixelObservation.model_construct(
        **FIELDS,
        screenshot=Pixels(array),
        last_action_error=False,
        done=False,
        reward=None,
        metadata={"a": 1},
    )
    theirs = BrowserGymObservation.model_construct(
        **FIELDS,
        screenshot=array.tolist(),
        last_action_error=False,
        done=False,
        reward=None,
        metadata={"a": 1},
    )
    ours_kept, ours_text, ours_s = kept_and_text(ours)
    theirs_kept, theirs_text, theirs_s = kept_and_text(theirs)
    payload = json.loads(ours_text)["data"]
    read = BrowserGymEnv._parse_result(BrowserGymEnv.__new__(BrowserGymEnv), payload)
    image = screenshot_of(ours.screenshot)  # what keyshot's rubric records
    print(
        json.dumps(
            {
                "same_text": ours_text == theirs_text,
                "client_reads_the_array": bool(
                    np.array_equal(np.asarray(read.observation.screenshot), array)
                ),
                "client_reads_html": read.observation.pruned_html,
                "rubric_reads_the_array": bool(np.array_equal(np.asarray(image), array)),
                "kept_mib": {"pixels": ours_kept, "nested_lists": theirs_kept},
                "encode_s": {"pixels": ours_s, "nested_lists": theirs_s},
            }
        )
    )


if __name__ == "__main__":
    main()
