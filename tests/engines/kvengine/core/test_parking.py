"""Parking (issue 46): a sequence whose client stopped reading gives up its batch slot and its device pages,
and on resume is readmitted first, reusing its cached pages, with the same output as if never parked."""

from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Request, RequestId, Scheduler, SchedulerConfig

from .test_scheduler import PS, prompt, step


def test_a_parked_sequence_frees_its_slot_and_pages_and_resumes_from_its_cached_pages():
    pool = PagePool(33, PS)
    sched = Scheduler(PrefixIndex(pool), SchedulerConfig(max_num_seqs=1, max_step_tokens=256))
    sched.add(Request(RequestId("stalled"), prompt(40, 1), max_new_tokens=30))
    sched.add(Request(RequestId("other"), prompt(20, 2), max_new_tokens=2))
    for t in range(3):  # prefill (40 tokens, 3 pages), then two decodes: 42 tokens computed
        plan, _ = step(sched, float(t))
        assert [s.request_id for s in plan.seqs] == ["stalled"]  # one slot: "other" waits
    assert sched.park(RequestId("stalled"), 3.0)
    assert not sched.park(RequestId("stalled"), 3.0)  # already parked
    sched.check_integrity()  # it holds no device page: its two full pages are cached, the third released
    assert (sched.num_running, sched.num_waiting, sched.num_parked) == (0, 1, 1)
    assert pool.num_free == pool.capacity - 2
    plan, done = step(sched, 4.0)  # the slot is free: "other" runs
    assert [s.request_id for s in plan.seqs] == ["other"]
    assert sched.resume(RequestId("stalled")) and not sched.resume(RequestId("stalled"))
    while sched.num_running:  # "other" finishes; the resumed sequence is first in line for its slot
        plan, done = step(sched, 5.0)
    plan, _ = step(sched, 6.0)  # readmitted: its 2 cached pages reused, the rest of its 43 tokens recomputed
    [item] = plan.seqs
    assert (item.request_id, item.start, item.end, item.samples) == ("stalled", 2 * PS, 43, True)
    sched.check_integrity()
    while sched.has_work():
        _, done = step(sched, 7.0)
    assert done[0].request_id == "stalled" and done[0].output == (7,) * 30  # every token, none twice
    sched.check_integrity()


def test_a_parked_sequence_can_be_finished_and_a_waiting_one_parked():
    pool = PagePool(33, PS)
    sched = Scheduler(PrefixIndex(pool), SchedulerConfig(max_num_seqs=1))
    sched.add(Request(RequestId("a"), prompt(20, 3), max_new_tokens=5))
    sched.add(Request(RequestId("b"), prompt(20, 4), max_new_tokens=5))
    step(sched, 0.0)
    assert sched.park(RequestId("a"), 1.0) and sched.park(RequestId("b"), 1.0)  # running, then waiting
    assert not sched.has_work() and sched.num_parked == 2
    finished = sched.finish(RequestId("a"), 2.0, "abort")  # its client was given up on
    assert finished is not None and finished.output == (7,) and sched.num_parked == 1
    assert sched.finish(RequestId("a"), 2.0) is None and not sched.park(RequestId("a"), 2.0)
    sched.check_integrity()
    assert pool.num_free == pool.capacity - 1  # a's one full page stays cached, evictable
