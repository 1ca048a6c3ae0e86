"""The hourly recalculation's keys are the one-job order keys: ``maybe_recalc``'s loop must
give every pending job the key ``order_key`` gives it on the same state, to the last bit
(a guard for any faster loop; note 080 tried one and took it back)."""

from builders import job, policy_dict

from gpushepherd.core import Scheduler, priority
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.policy import policy_from_dict

H = 3600.0


def test_recalculated_keys_equal_the_one_job_keys_with_every_factor():
    rules = policy_from_dict(policy_dict(
        nodes=[("n1", 2)], preemption=False, teams={"a": {}, "b": {}},
        priority={"weights": {"class": 1000, "fair_share": 10000, "age": 3000, "size": 700, "time_limit": 5000,
                              "deadline": 900},
                  "recalc_s": 600, "max_age_s": 7200},
        fair_share={"half_life_s": 3600})).rules
    sched = Scheduler(rules)
    book = sched.book
    for i in range(40):  # two GPUs: two jobs run (never end here), the others wait
        t = i * 97.0
        sched.handle([JobSubmitted(t, job(f"j{i}", 1 + i % 2, team="ab"[i % 2], submit=t,
                                          time_limit_s=600.0 * (1 + i % 5),
                                          deadline=(t + 5 * H) if i % 3 == 0 else None))])
    assert len(book.queue) >= 5
    checked = 0
    for t in (book.next_recalc, book.next_recalc + 1800):
        sched.handle([Tick(t)])
        assert book.recalc_t == t
        for j in book.queue.jobs():
            if j.key[0] == 1:
                continue
            memo = priority._fs_memo(book)
            assert j.key == priority.order_key(book, j.spec, j.cls, j.estimate_s, memo, prev=j.key[0])
            checked += 1
    assert checked >= 10

