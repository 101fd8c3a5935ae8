"""One server's share of a claim call, in Redis's own commands: read, then write all or nothing.

Three round trips on one connection, every per-id step a native command (no script):

1. ``WATCH`` the partition's meta on this server, read it (position, newest receive time, which
   slots hold ids and until when) with the server's clock, and the lock when this server holds
   it. The holder's lock and the position it last saw are checked here.
2. ``HMGET`` the call's ids in their buckets of every slot that holds ids within the window:
   the ids found are decided (duplicates, or this holder's own earlier claims).
3. ``MULTI``, ``HSET`` the new ids into their buckets with their ``PEXPIRE``, advance the meta
   (position on the last chunk, newest, counters, per-slot figures, slots aged out), ``EXEC``.
   Any write to the meta since step 1 (another holder) makes ``EXEC`` write nothing.

A lookup (another epoch's servers while resharding) runs steps 1-2 without the ``WATCH``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hiredis
import numpy as np
import redis as redis_client
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from exactly.dedupe.redis.resp import ID_ARG, command, grouped, id_args, pair_args
from exactly.dedupe.redis.sharding import Epoch, bucket_ttl
from exactly.errors import StoreUnavailable


@dataclass(frozen=True)
class Groups:
    """A call's ids, in call order, grouped by bucket: per group its slot, bucket, the end of its
    ids in call order and its earliest receive time."""

    slots: Any
    buckets: Any
    ends: Any
    earliest: Any

    def of(self, count: int) -> Any:
        """The group index of each of ``count`` ids."""
        return np.repeat(np.arange(len(self.ends)), np.diff(self.ends, prepend=0))[:count]


@dataclass(frozen=True)
class ServerCall:
    """What one server is asked: ``mode`` is ``claim``, ``restore`` or ``lookup``."""

    prefix: str
    mode: str
    epoch: Epoch
    expected: int | None  # the position this holder last saw on the server
    finish: int | None  # the position to reach (the last chunk of a batch), None: unchanged
    counted_from: int  # ids at or past this offset are counted (not replays)
    newest: int  # the batch's newest receive time (ms)
    lookup: range  # slots that may hold ids received within the window
    window: int
    fresh: int  # ids of this call at or past counted_from
    extra: tuple[int, int]  # claimed and duplicates the client decided (repeats, other epoch)
    lock: tuple[str, str] | None  # the lock's key and this holder's token, on its server
    # the store's scope key and the scope, set if missing in the transaction that writes: a
    # server restarted empty is never written to without the scope of the ids it holds
    scope: tuple[str, str] | None = None

    @property
    def writing(self) -> bool:
        return self.mode != "lookup"


@dataclass(frozen=True)
class ServerReply:
    position: int | None  # the server's position after the call
    largest: int  # ids in the bucket the call gave the most (for the listpack warning)
    found: list[tuple[int, int]]  # (index in call order, owner offset) of each id found


class Commands:
    """Commands to send at once, and how many replies they will get."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.count = 0

    def add(self, *args: bytes | str | int) -> None:
        self.parts.append(command(*args))
        self.count += 1

    def extend(self, parts: list[bytes | memoryview], count: int) -> None:
        self.parts += parts
        self.count += count

    def exchange(self, conn: Any) -> list[Any]:
        """Send them in one write and read their replies."""
        conn.send_packed_command([b"".join(self.parts)])
        return read_replies(conn, self.count)


def read_replies(conn: Any, count: int) -> list[Any]:
    """``count`` replies, parsed by hiredis straight from the connection's socket.

    A claim call gets a reply per bucket and command, and redis-py's ``read_response`` costs
    about ten times hiredis's own parsing per reply. The server sends nothing but these replies,
    so nothing is left behind for redis-py to read.
    """
    reader = hiredis.Reader(replyError=ResponseError)
    replies: list[Any] = []
    try:
        while len(replies) < count:
            reply = reader.gets()
            if reply is False:
                data = conn._sock.recv(1 << 20)
                if not data:
                    raise RedisConnectionError("the server closed the connection")
                reader.feed(data)
            elif isinstance(reply, ResponseError):
                raise reply
            else:
                replies.append(reply)
    except OSError as error:  # a timeout too
        raise RedisConnectionError(f"reading replies: {error}") from None
    return replies


def run(
    client: redis_client.Redis, call: ServerCall, rows: Any, offsets: Any, groups: Groups
) -> ServerReply:
    """Steps 1-3 on ``client``'s server for ids ``rows`` (uint8, 16 a row) owned by ``offsets``."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        return _run(conn, call, rows, offsets, groups)
    except BaseException:
        conn.disconnect()  # a WATCH or unread replies may be left on it
        raise
    finally:
        pool.release(conn)


def _run(conn: Any, call: ServerCall, rows: Any, offsets: Any, groups: Groups) -> ServerReply:
    meta_key = call.prefix + "meta"
    # 1. the meta, watched, and the lock
    first = Commands()
    if call.writing:
        first.add("WATCH", meta_key)
    first.add("HGETALL", meta_key)
    first.add("TIME")
    if call.writing and call.lock is not None:
        first.add("GET", call.lock[0])
    replies = first.exchange(conn)[1 if call.writing else 0 :]
    meta = {_text(k): int(v) for k, v in _pairs(replies[0])}
    now = int(replies[1][0]) * 1000 + int(replies[1][1]) // 1000
    if call.writing:
        _check(conn, call, meta, replies[2] if call.lock is not None else None)
    # 2. the ids in every live slot of the window, newest slot first
    live = [
        slot
        for slot in reversed(call.lookup)
        if f"n:{slot}" in meta and meta.get(f"x:{slot}", now + 1) > now
    ]
    owners = np.full(len(rows), -1, np.int64)
    if live and len(rows):
        owners = _lookup(conn, call.prefix, live, rows, groups)
    found = [(int(i), int(owners[i])) for i in np.flatnonzero(owners >= 0)]
    if not call.writing:
        return ServerReply(None, 0, found)
    # 3. the new ids and the meta, all or nothing
    newest = max(call.newest, meta.get("newest", call.newest))
    position = -1 if call.expected is None else call.expected
    if call.finish is not None:
        position = max(position, call.finish)
    last = Commands()
    last.add("MULTI")
    written = _writes(last, call, rows, offsets, groups, owners, newest)
    _meta_update(last, call, meta, now, newest, position, written, offsets, owners)
    if call.scope is not None:
        last.add("SET", *call.scope, "NX")
    last.add("EXEC")
    results = last.exchange(conn)[-1]
    if results is None:
        raise StoreUnavailable(
            "the partition's meta changed during the claim: the partition lock was lost to "
            "another holder"
        )
    for result in results:
        if isinstance(result, ResponseError):
            raise result
    largest = int(results[2 * len(written)]) if written else 0
    return ServerReply(None if position < 0 else position, largest, found)


def _check(conn: Any, call: ServerCall, meta: dict[str, int], holder: bytes | None) -> None:
    """The lock is still this holder's and the position the one it last saw; else UNWATCH."""
    problem = None
    if call.lock is not None and _text(holder or b"") != call.lock[1]:
        problem = "the partition lock was lost to another holder"
    expected = -1 if call.expected is None else call.expected
    if problem is None and meta.get("position", -1) != expected:
        stored = meta.get("position", "gone")
        problem = (
            f"position is {stored}, expected {expected}: the shard lost claims or another "
            "task wrote"
        )
    if problem is not None:
        undo = Commands()
        undo.add("UNWATCH")
        undo.exchange(conn)
        raise StoreUnavailable(problem)


def _lookup(conn: Any, prefix: str, live: list[int], rows: Any, groups: Groups) -> Any:
    """Each id's owner offset in the newest live slot holding it; -1 where none does."""
    count = len(rows)
    args = id_args(rows)
    ends = np.arange(1, count + 1) * ID_ARG
    group_ends = groups.ends.tolist()
    reads = Commands()
    for slot in live:
        keys = [f"{prefix}{slot}:{bucket}".encode() for bucket in groups.buckets.tolist()]
        reads.extend(grouped(b"HMGET", keys, args, ends, group_ends, 1), len(keys))
    owners = np.full(count, -1, np.int64)
    starts = [0, *group_ends]
    for number, got in enumerate(reads.exchange(conn)):
        if got.count(None) == len(got):
            continue
        begin = starts[number % len(group_ends)]
        for at, value in enumerate(got):
            if value is not None and owners[begin + at] < 0:
                owners[begin + at] = int(value)
    return owners


def _writes(
    out: Commands,
    call: ServerCall,
    rows: Any,
    offsets: Any,
    groups: Groups,
    owners: Any,
    newest: int,
) -> list[tuple[int, int, int]]:
    """``HSET`` and ``PEXPIRE`` per bucket for the ids not found, and ``HLEN`` of the bucket given
    the most (buckets fill evenly: it stands for the largest, for the listpack warning). Returns
    per bucket written its slot, the ids written and its earliest receive time."""
    new = owners < 0
    if not new.any():
        return []
    per_group = np.bincount(groups.of(len(rows))[new], minlength=len(groups.ends))
    kept = np.flatnonzero(per_group)
    args, ends = pair_args(rows[new], offsets[new])
    slots, buckets = groups.slots[kept].tolist(), groups.buckets[kept].tolist()
    keys = [f"{call.prefix}{s}:{b}".encode() for s, b in zip(slots, buckets, strict=True)]
    sets = grouped(b"HSET", keys, args, ends, np.cumsum(per_group[kept]).tolist(), 2)
    ttls = {slot: bucket_ttl(call.epoch, slot, call.window, newest) for slot in set(slots)}
    expiries = {slot: b"$%d\r\n%d\r\n" % (len(str(ttl)), ttl) for slot, ttl in ttls.items()}
    for at, key in enumerate(keys):
        out.extend(sets[2 * at : 2 * at + 2], 1)
        out.extend([b"*3\r\n$7\r\nPEXPIRE\r\n$%d\r\n%s\r\n" % (len(key), key)], 0)
        out.extend([expiries[slots[at]]], 1)  # PEXPIRE key ttl, its tail built once per slot
    out.add("HLEN", keys[int(np.argmax(per_group[kept]))])
    counts, earliest = per_group[kept].tolist(), groups.earliest[kept].tolist()
    return list(zip(slots, counts, earliest, strict=True))


def _meta_update(
    out: Commands,
    call: ServerCall,
    meta: dict[str, int],
    now: int,
    newest: int,
    position: int,
    written: list[tuple[int, int, int]],
    offsets: Any,
    owners: Any,
) -> None:
    """The meta's position, newest, counters and per-slot figures; slots aged out dropped."""
    key = call.prefix + "meta"
    fields: dict[str, int] = {"newest": newest}
    if position >= 0:
        fields["position"] = position
    increments: dict[str, int] = {}
    if call.mode == "claim":
        found = (owners >= 0) & (offsets >= call.counted_from)
        increments["claimed"] = call.fresh + call.extra[0]
        increments["new"] = call.fresh - int(np.count_nonzero(found))
        increments["duplicates"] = int(np.count_nonzero(found & (owners != offsets)))
        increments["duplicates"] += call.extra[1]
    per_slot: dict[int, tuple[int, int]] = {}
    for slot, count, earliest in written:
        total, first = per_slot.get(slot, (0, earliest))
        per_slot[slot] = (total + count, min(first, earliest))
    for slot, (count, earliest) in per_slot.items():
        increments[f"n:{slot}"] = count
        if meta.get(f"t:{slot}", earliest + 1) > earliest:
            fields[f"t:{slot}"] = earliest
        fields[f"x:{slot}"] = now + bucket_ttl(call.epoch, slot, call.window, newest)
    out.add("HSET", key, *(part for field in fields.items() for part in field))
    for name, amount in increments.items():
        if amount > 0:
            out.add("HINCRBY", key, name, amount)
    # slots whose buckets expired: their ids count as aged out
    gone = [
        name[2:]
        for name, value in meta.items()
        if name[:2] == "x:" and value <= now and int(name[2:]) not in per_slot
    ]
    if gone:
        out.add("HDEL", key, *(f"{kind}:{name}" for name in gone for kind in "ntx"))
        aged = sum(meta.get(f"n:{name}", 0) for name in gone)
        if aged > 0:
            out.add("HINCRBY", key, "aged", aged)


def _pairs(reply: Any) -> Any:
    """A hash's fields and values: a map in RESP3, a flat array in RESP2."""
    return reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name
