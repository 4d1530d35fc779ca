"""Property tests of a stream reader's step (``bucketq.core.stream_step``): whatever lands, stays missing,
is claimed, finished or marked as a gap, and however time passes, the step commits exactly past what is
settled, offers every claimable bucket and no other, marks a hole only after ``gap_wait``, and names the times
at which an idle reader must look again (a hole due, another reader's lease over)."""

from __future__ import annotations

import datetime as dt

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.core.stream_gaps import HoleWatch
from bucketq.core.stream_step import Step, Window, step

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
GAP_WAIT = 5.0
LEASE = 10.0


class ReaderStepMachine(RuleBasedStateMachine):
    """One partition of a stream, one reader under test and other readers of its group, as sets; the reader
    looks (``step``) and does what the step says, claiming the first bucket offered."""

    def __init__(self) -> None:
        super().__init__()
        self.last = 0  # the counter: sequences 1..last are allocated
        self.landed: set[int] = set()  # buckets stored
        self.gaps: set[int] = set()  # gap markers stored
        self.claims: dict[int, tuple[bool, dt.datetime, bool]] = {}  # seq -> (finished, lease until, mine)
        self.start = 1  # the group's committed sequence
        self.now, self.mono = T0, 0.0
        self.holes = HoleWatch(GAP_WAIT)
        self.first_missing: dict[int, float] = {}  # the model's own record of when a hole was first seen

    def _present(self) -> list[int]:
        return sorted(s for s in self.landed | self.gaps if s >= self.start)

    def _settled(self, seq: int) -> bool:
        return seq in self.gaps or seq in self.claims and self.claims[seq][0]

    def _live(self, seq: int) -> bool:
        return seq in self.claims and not self.claims[seq][0] and self.claims[seq][1] >= self.now  # core.claim: $lt

    @rule(count=st.integers(1, 3))
    def allocate(self, count: int) -> None:
        self.last += count

    @rule(data=st.data())
    def land(self, data: st.DataObject) -> None:
        missing = sorted(set(range(1, self.last + 1)) - self.landed - self.gaps)
        if missing:
            self.landed.add(data.draw(st.sampled_from(missing)))

    @rule(data=st.data(), finish=st.booleans())
    def another_reader(self, data: st.DataObject, finish: bool) -> None:
        """Another reader claims a bucket nobody holds, or finishes it at once."""
        free = [s for s in self._present() if s in self.landed and not self._settled(s) and not self._live(s)]
        if free:
            seq = data.draw(st.sampled_from(free))
            self.claims[seq] = (finish, self.now + dt.timedelta(seconds=LEASE), False)

    @rule(data=st.data())
    def finish_mine(self, data: st.DataObject) -> None:
        mine = [s for s, (fin, _, me) in self.claims.items() if me and not fin and self._live(s)]
        if mine:
            seq = data.draw(st.sampled_from(sorted(mine)))
            self.claims[seq] = (True, self.claims[seq][1], True)

    @rule(seconds=st.sampled_from([0.5, 2.0, 6.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.mono += seconds

    @precondition(lambda self: self.last > 0)
    @rule()
    def look(self) -> None:
        present = self._present()
        claims = [{"s": s, "fin": fin, "lease": {"until": until}} for s, (fin, until, _) in self.claims.items()
                  if s >= self.start]
        window = Window.read(self.start, self.last, present, [s for s in present if s in self.gaps], claims)
        held = [s for s, (fin, _, me) in self.claims.items() if me and not fin and self._live(s)]
        got = step(window, held, self.holes, self.now, self.mono)
        self._check(got, set(present), held)
        if got.commit is not None:
            self.start = got.commit
        if got.claims:
            self.claims[got.claims[0]] = (False, self.now + dt.timedelta(seconds=LEASE), True)
        else:
            self.gaps.update(got.gaps)

    def _check(self, got: Step, present: set[int], held: list[int]) -> None:
        committed = self.start
        while committed in present and self._settled(committed):
            committed += 1
        assert got.commit == (committed if committed > self.start else None), "commits exactly past the settled"
        claimable = [s for s in sorted(present) if not self._settled(s) and not self._live(s)]
        assert got.claims == claimable, "offers every claimable bucket, in order, and no other"
        missing = set(range(self.start, self.last + 1)) - present
        self.first_missing = {s: t for s, t in self.first_missing.items() if s in missing}
        for seq in missing:
            self.first_missing.setdefault(seq, self.mono)
        assert got.gaps == sorted(s for s, t in self.first_missing.items() if self.mono - t >= GAP_WAIT), \
            "marks a hole exactly when it has been missing for gap_wait"
        due = [t + GAP_WAIT for t in self.first_missing.values()]
        assert got.recheck_at == (min(due) if due else None), "looks again when the first hole is due"
        foreign = [self.claims[s][1] for s in present if self._live(s) and s not in held]
        assert got.lease_ends == (min(foreign) if foreign else None), "looks again when a foreign lease ends"

    @invariant()
    def never_commits_past_an_unsettled_sequence(self) -> None:
        assert all(s in self.gaps or s in self.landed and self._settled(s) for s in range(1, self.start))


TestReaderStepMachine = ReaderStepMachine.TestCase
