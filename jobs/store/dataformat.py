"""The version of forq's data in Redis, so that two versions of forq on one Redis (a
rolling upgrade) never misread each other's records.

``forq:format`` is a hash: ``version`` (the newest format any forq wrote here) and
``readers_from`` (the oldest format a forq must speak to use this data). A forq speaks
`FORMAT` and, of older data, everything from `READERS_FROM` on. On first use of a Redis
(once per client), a producer or supervisor:

* finds no key: writes its own (a fresh Redis, or one from before formats existed,
  which is format 1);
* finds ``readers_from`` above its `FORMAT`: refuses with `IncompatibleFormat` (a newer
  forq changed the records in a way this one would misread): upgrade it;
* finds an older ``version`` it can still read: raises it to its own, in one script,
  so that older forqs that cannot read the new format refuse from then on.

Bump `FORMAT` when a change makes records or keys that an older forq would misread;
set `READERS_FROM` to the oldest format whose readers still work with the new data
(equal to `FORMAT` when none do). Scripts need no such care: each is called by the
SHA1 of its own text (EVALSHA), so two versions never run each other's scripts.
"""

from __future__ import annotations

from typing import Any

from forq.errors import IncompatibleFormat
from forq.store.keys import FORMAT as FORMAT_KEY

# 2: batches and dependencies. A job's end now acts on its links (its batch's counter,
# the jobs waiting on it): an older forq's ack would end a batch member without counting
# it, and its stats and cancel know no `waiting` state. Groups came just before it: an
# older forq's reclaim or release would put a grouped job in `pending` without freeing its
# group's slot, so format 1 forqs must not share a Redis where groups are used.
FORMAT = 2
READERS_FROM = 2

# atomically: read the format, refuse or raise it. Returns {version, readers_from} after.
_CHECK = """
local v = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local r = tonumber(redis.call('HGET', KEYS[1], 'readers_from') or '0')
local mine, from = tonumber(ARGV[1]), tonumber(ARGV[2])
if r > mine then return {v, r} end
if v < mine then
  redis.call('HSET', KEYS[1], 'version', mine, 'readers_from', math.max(r, from))
  return {mine, math.max(r, from)}
end
return {v, r}
"""


def ensure(client: Any, where: str = "") -> None:
    """Check (and, if older, raise) the data format in the Redis behind `client`; once
    per client. Raises IncompatibleFormat naming both formats and what to do."""
    if getattr(client, "_forq_format_ok", False):
        return
    version, readers_from = (int(x) for x in client.eval(_CHECK, 1, FORMAT_KEY, FORMAT,
                                                           READERS_FROM))
    if readers_from > FORMAT:
        raise IncompatibleFormat(
            f"Redis{f' at {where}' if where else ''} holds forq data in format {version}, "
            f"which needs a forq that speaks format {readers_from} or newer; this forq "
            f"speaks format {FORMAT}: upgrade forq here (nothing was changed)")
    try:
        client._forq_format_ok = True
    except AttributeError:  # a client that takes no attributes: check again next time
        pass
