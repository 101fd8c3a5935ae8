"""Packs, the batches the route query makes: their bytes, how a micro-batch is cut into them,
and how the director takes and sends one (pure parts, no JobDB)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from exactly.delivery import packs
from exactly.delivery.batches import OVERHEAD
from exactly.delivery.director.queues import Bucket
from exactly.delivery.director.shipment import JobShipment, PackShipment, shipment_of
from exactly.delivery.jobdb.base import Job, NewJob
from exactly.delivery.packs import Member, packing
from exactly.delivery.route import EventColumns, Outcome, jobs_for, packed
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.transforms import FAILED, SENT

MEMBERS = st.lists(
    st.builds(
        Member,
        st.text(min_size=1, max_size=12),
        st.none() | st.text(max_size=12),
        st.dictionaries(st.text(max_size=4), st.text(max_size=8), max_size=3).map(
            lambda d: json.dumps(d, ensure_ascii=False).encode()
        ),
    ),
    min_size=1,
    max_size=20,
)


def destination(**batch: object) -> DestinationSettings:
    return DestinationSettings.model_validate(
        {"name": "hook", "url": "http://127.0.0.1:9/", "batch": {"max_events": 3, **batch}}
    )


@given(MEMBERS)
def test_a_pack_gives_its_members_back_in_order(members: list[Member]) -> None:
    payload = packs.pack(members)
    assert packs.is_packed(payload)
    assert packs.count(payload) == len(members)
    assert packs.members(payload) == members
    assert packs.payloads(payload) == [member.payload for member in members]
    assert packs.joined(payload) == b",".join(member.payload for member in members)
    assert json.loads(b"[" + packs.joined(payload) + b"]") == [
        json.loads(member.payload) for member in members
    ]


def test_an_event_is_not_a_pack() -> None:
    for payload in (b'{"messageId":"m1"}', b"[]", b"", b"\x00"):
        assert not packs.is_packed(payload)
        assert packs.count(payload) == 1


def test_a_key_names_its_destination_and_members_in_order() -> None:
    key = packs.pack_key("hook", ["m1", "m2"])
    assert key.startswith("pack_") and len(key) <= 64
    assert key == packs.pack_key("hook", iter(["m1", "m2"]))
    assert key != packs.pack_key("other", ["m1", "m2"])
    assert key != packs.pack_key("hook", ["m2", "m1"])
    assert key != packs.pack_key("hook", ["m1"])


def test_a_key_is_the_same_as_when_it_was_hashed_id_by_id() -> None:
    """Keys already in JobDBs stay the keys of their packs: the digest of the destination and
    of each id after a newline, as the first packs were keyed."""
    for ids in (["m1"], ["m1", "m2", "ü-3"], ["", "x"]):
        digest = hashlib.sha256(b"pack\nhook")
        for message_id in ids:
            digest.update(b"\n" + message_id.encode())
        assert packs.pack_key("hook", ids) == "pack_" + digest.hexdigest()[:32]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["web", "ios", ""]),
            st.integers(1, 900),
            st.none() | st.text(max_size=6),
            st.booleans(),
        ),
        max_size=60,
    ),
    st.integers(2, 7),  # max_events: 1 is no batching
    st.integers(1024, 3000),
)
def test_the_route_s_packs_from_columns_are_its_packs_of_jobs(
    rows: list[tuple[str, int, str | None, bool]], max_events: int, max_bytes: int
) -> None:
    """jobs_for packs a batching destination's events straight from the columns; packed()
    packs jobs (a transform's): both cut and pack the same events alike."""
    hook = destination(max_events=max_events, max_bytes=max_bytes)
    n = len(rows)
    events = EventColumns(
        [source for source, _, _, _ in rows],
        ["e"] * n,
        [f"m{i}" for i in range(n)],
        [user for _, _, user, _ in rows],
        [b'"%s"' % (b"x" * size) for _, size, _, _ in rows],
        [0] * n,
        list(range(n)),
        takes=[[take for _, _, _, take in rows]],
    )
    jobs = [
        NewJob(source, "hook", payload, message_id, user, hook.window)
        for source, payload, message_id, user, (*_, take) in zip(
            events.source, events.payload, events.message_id, events.user_id, rows, strict=True
        )
        if take
    ]
    made = jobs_for(events, [hook], now=0.0)
    assert made == packed(jobs, hook)
    # and what a pack is, checked apart from the code that cuts: per bucket, the members in
    # log order; each pack as full as the limits let it be
    for source in {job.source for job in jobs}:
        mine = [job for job in made if job.source == source]
        members = [packs.members(job.payload) for job in mine]
        assert [m.message_id for ms in members for m in ms] == [
            job.message_id for job in jobs if job.source == source
        ]
        for ms, after in zip(members, [*members[1:], None], strict=True):
            size = OVERHEAD["json-array"] + sum(len(m.payload) + 1 for m in ms)
            assert len(ms) <= max_events and (len(ms) == 1 or size <= max_bytes)
            if after is not None:  # the next member did not fit
                assert len(ms) == max_events or size + len(after[0].payload) + 1 > max_bytes


def test_trim_takes_out_only_the_members_picked() -> None:
    members = [Member(f"m{i}", f"u{i % 2}", b'{"n":%d}' % i) for i in range(5)]
    payload = packs.pack(members)
    same, gone = packs.trim(payload, lambda m: False)
    assert same is payload and gone == 0
    kept, gone = packs.trim(payload, lambda m: m.user_id == "u1")
    assert gone == 2 and kept is not None
    assert packs.members(kept) == [m for m in members if m.user_id == "u0"]
    assert packs.trim(payload, lambda m: True) == (None, 5)


def _events(n: int, sources: list[str] | None = None, size: int = 10) -> EventColumns:
    sources = sources or ["web"] * n
    return EventColumns(
        sources,
        ["Signed Up"] * n,
        [f"m{i}" for i in range(n)],
        [f"u{i}" for i in range(n)],
        [b'{"n":"' + b"x" * size + b'%d"}' % i for i in range(n)],
        [0] * n,
        list(range(n)),
    )


def test_the_route_packs_a_batching_destination_per_bucket_in_log_order() -> None:
    hook = destination()
    single = DestinationSettings.model_validate({"name": "one", "url": "http://127.0.0.1:9/"})
    ordered = DestinationSettings.model_validate(
        {"name": "ord", "url": "http://127.0.0.1:9/", "ordered": True, "batch": {"max_events": 3}}
    )
    assert packing(hook) and not packing(single) and not packing(ordered)
    events = _events(8, ["web", "web", "ios", "web", "ios", "web", "web", "web"])
    jobs = jobs_for(events, [hook, single, ordered], now=100.0)
    packed_jobs = [job for job in jobs if job.destination == "hook"]
    assert all(packs.is_packed(job.payload) for job in packed_jobs)
    by_bucket = [
        (job.source, [m.message_id for m in packs.members(job.payload)]) for job in packed_jobs
    ]
    assert by_bucket == [
        ("web", ["m0", "m1", "m3"]),
        ("web", ["m5", "m6", "m7"]),
        ("ios", ["m2", "m4"]),
    ]
    assert [job.message_id for job in packed_jobs] == [
        packs.pack_key("hook", ids) for _, ids in by_bucket
    ]
    assert all(job.user_id is None for job in packed_jobs)
    assert sum(job.events for job in packed_jobs) == 8
    # the others: a job per event, as before
    assert len([job for job in jobs if job.destination == "one"]) == 8
    assert len([job for job in jobs if job.destination == "ord"]) == 8


def test_a_pack_keeps_to_max_bytes_and_a_failed_transform_stays_alone() -> None:
    hook = destination(max_events=100, max_bytes=1024)
    events = _events(7, size=300)  # payloads of 309 bytes: three to a body of at most 1,024
    jobs = [NewJob("web", "hook", p, m, u, 5.0) for p, m, u in zip(*_cols(events), strict=True)]
    jobs[3] = NewJob("web", "hook", jobs[3].payload, "m3", "u3", 5.0, error="boom")
    made = packed(jobs, hook)
    assert [job.error for job in made] == [None, None, "boom"]
    assert [[m.message_id for m in packs.members(job.payload)] for job in made[:2]] == [
        ["m0", "m1", "m2"],
        ["m4", "m5", "m6"],
    ]
    assert all(len(packs.joined(job.payload)) + OVERHEAD["json-array"] <= 1024 for job in made[:2])
    assert made[2].payload == jobs[3].payload and made[2].message_id == "m3"
    assert [job.expire_at for job in made] == [5.0] * 3


def _cols(events: EventColumns) -> tuple[list[bytes], list[str], list[str | None]]:
    return list(events.payload), [str(m) for m in events.message_id], list(events.user_id)


def test_a_transform_s_bodies_are_packed() -> None:
    hook = destination()
    events = _events(2)
    shaped = EventColumns(
        *(getattr(events, f) for f in ("source", "name", "message_id", "user_id", "payload")),
        events.partition,
        events.offset,
        shaped={0: [Outcome(SENT, b'{"shaped":0}', None), Outcome(FAILED, None, "bad")]},
    )
    jobs = jobs_for(shaped, [hook], now=0.0)
    assert [packs.payloads(jobs[0].payload), jobs[1].error] == [[b'{"shaped":0}'], "bad"]


def _job(job_id: int, payload: bytes) -> Job:
    return Job(job_id, "web/hook", "hook", payload, f"k{job_id}", None, 0.0, 9e9)


def test_the_director_takes_a_pack_alone_and_forms_batches_only_of_single_jobs() -> None:
    pack = packs.pack([Member("a", None, b"{}"), Member("b", None, b"[]")])
    bucket = Bucket("web/hook", ordered=False)
    bucket.place([_job(1, b"{}"), _job(2, b"{}"), _job(3, pack), _job(5, b"{}")], now=0.0)
    limits = destination(max_wait=0).batch
    first, _ = bucket.next_batch(10.0, limits)
    assert [job.id for job in first] == [1, 2]  # a batch stops before the pack
    second, _ = bucket.next_batch(10.0, limits)
    assert [job.id for job in second] == [3] and bucket.taken == 3
    third, _ = bucket.next_batch(10.0, limits)
    assert [job.id for job in third] == [5]


def test_a_pack_is_sent_as_a_batch_in_each_format() -> None:
    members = [Member("a", None, b'{"n":1}'), Member("b", "u", b'{"n":2}')]
    job = _job(3, packs.pack(members))
    bucket = Bucket("web/hook", ordered=False)
    shipment = shipment_of(bucket, job, counted=True)
    assert isinstance(shipment, PackShipment) and shipment.events == 2
    assert shipment.key == "k3"
    assert shipment.body(destination()) == b'[{"n":1},{"n":2}]'
    ndjson = destination(format="ndjson")
    assert shipment.body(ndjson) == b'{"n":1}\n{"n":2}\n'
    assert shipment.content_type(ndjson) == "application/x-ndjson"
    segment = json.loads(shipment.body(destination(format="segment")))
    assert segment["batch"] == [{"n": 1}, {"n": 2}]
    plain = shipment_of(bucket, _job(4, b"{}"))
    assert type(plain) is JobShipment and plain.events == 1


def test_a_page_placed_with_keep_drops_and_trims_only_its_own_jobs() -> None:
    """Forgetting's ``keep`` on a page: a forgotten person's job is not held (the cursor moves
    past it), a pack keeps its other members and counts them, and jobs placed before are not
    looked at again."""
    pack = packs.pack([Member("a", "gone", b"{}"), Member("b", "kept", b"[]")])
    seen: list[int] = []

    def keep(job: Job) -> Job | None:
        seen.append(job.id)
        if job.packed:
            payload, _ = packs.trim(job.payload, lambda member: member[1] == "gone")
            return None if payload is None else dataclasses.replace(job, payload=payload)
        return None if job.user_id == "gone" else job

    bucket = Bucket("web/hook", ordered=False)
    bucket.place([_job(1, b"{}")], now=0.0)
    gone = dataclasses.replace(_job(2, b"{}"), user_id="gone")
    bucket.place([gone, _job(3, pack), _job(4, b"{}")], now=0.0, keep=keep)
    assert seen == [2, 3, 4] and bucket.cursor == 4
    assert [job.id for job in bucket.ready] == [1, 3, 4]
    assert packs.payloads(bucket.ready[1].payload) == [b"[]"]
    assert bucket.held_events == 3
