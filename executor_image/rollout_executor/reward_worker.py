"""One reward worker process: `python -m rollout_executor.reward_worker module:function`.

The executor's RewardPool starts these so that a synchronous reward (a sandboxed run, an
HTTP judge) never holds the executor's event loop. Frames on stdin/stdout are a 4-byte
big-endian length and a pickle; the reward's own prints go to stderr, never into a frame.
Requests: (RewardInput, kwargs). Replies: ("ok", value) or ("error", "Type: message"). The
first reply is ("ready", None) once the function imported, or ("error", why) before exiting.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

_LEN = struct.Struct(">I")


def write_frame(out: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(data)) + data)
    out.flush()


def read_frame(inp: BinaryIO) -> Any | None:
    """The next request, or None at end of input (the executor went away)."""
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    body = inp.read(n)
    if len(body) < n:
        return None
    return pickle.loads(body)


def main(argv: list[str]) -> int:
    # The protocol owns the real stdout; print() in a reward lands on stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    from rollout_executor.rewards import load_reward

    try:
        fn = load_reward(argv[0])
    except Exception as e:
        write_frame(out, ("error", f"{type(e).__name__}: {e}"))
        return 1
    write_frame(out, ("ready", None))
    while (req := read_frame(inp)) is not None:
        sample, kwargs = req
        try:
            reply: tuple[str, Any] = ("ok", fn(sample, **kwargs))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            write_frame(out, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            write_frame(out, ("error", f"reply cannot be pickled: {type(e).__name__}: {e}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
