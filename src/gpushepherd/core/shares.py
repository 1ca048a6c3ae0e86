"""The admission rule for GPU shares (design note 015, section 1; note 008 for the
kinds): fractions, memory slices, time-slice replicas, MPS clients and MIG instances.

``ShareRules`` is a part of ``Admission``: rules 1-9 for a share, where it lands (the
tightest card that fits, else a fresh GPU by best fit), what it is charged, and whether
it would delay a claim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpushepherd.core import pins
from gpushepherd.core.filters import share_fits_card
from gpushepherd.core.intake import units_of
from gpushepherd.core.ledger import FULL_MILLI
from gpushepherd.core.placement import members_of, pick_gpus
from gpushepherd.core.profile import Claim, Profile
from gpushepherd.core.state import Job
from gpushepherd.core.verdict import ADMITTED, ANTI, CLAIMS, CLASS_HOLD, COHORT, FREE, ORDER, Verdict
from gpushepherd.model.job import GPU_UNITS

if TYPE_CHECKING:
    from gpushepherd.core.admission import Scratch


def charged_by_spot(share) -> bool:
    """Whether a share's charge depends on the node it lands on: a memory-only
    fraction (its memory over the card's) or an MPS share without an SM percentage
    (1 / the node's ``max_clients`` per replica); while pending it is charged the least
    it could be (``intake.units_of``, note 037)."""
    return share.kind in ("fraction", "mps") and not share.milli


class ShareRules:
    """The share half of ``Admission`` (it reads ``self.book`` and the rules it shares
    with whole-GPU jobs: ``_hard``, ``_blocking``, ``_class_hold``, ``_cap``,
    ``_quota_claimed``, ``_charged``, ``never_fits``)."""

    def _share_never_fits(self, job: Job) -> bool:
        """Whether no GPU in service (healthy, no foreign processes) of the live nodes a
        share may use could ever hold it, all empty (MIG: a card with its profile, or a
        re-partitionable model, that is healthy)."""
        ledger = self.book.ledger
        share = job.share
        reconf = self.book.rules.mig_reconfigure
        for g in self.book.groups_for(job):
            node = ledger.groups[g].node
            if not share_fits_card(node, share, reconf):
                continue
            for idx in ledger.groups[g].members:
                slot = ledger.slots[idx]
                if share.kind == "mig":
                    # a healthy card with the profile, or any healthy one a reconfigurable
                    # node could re-partition (share_fits_card checked its model offers it)
                    if any(card.healthy and not card.unmanaged
                           and (reconf or any(inst.profile == share.profile for inst in card.layout))
                           for card in slot.migs.values()):
                        return False
                elif slot.healthy or slot.cards:
                    return False
        return True

    def _decide_share(self, job: Job, profile: Profile | None, scratch: Scratch | None,
                      before_claims=None) -> Verdict:
        """Rules 1-9 for a share: hard limits, a strict queue's order, a card that fits (the tightest shared card,
        else a fresh GPU), the cohort, anti-affinity, class holds for a fresh GPU,
        claims. A share charged by the card it lands on (``charged_by_spot``) is judged
        by rules 1-3 on its least charge, then by rule 2 again on the charge of the spot
        it would take - before rule 4: a hard limit it exceeds even as its strict
        queue's head is the reason, not the head (note 075)."""
        book = self.book
        self._exempt = ()
        self._kept = {}
        covered, charges = self._charged(job, job.units, scratch, profile)
        order = self._rules_1_to_4(job, charges, scratch)
        if order is not None and (order.rule != ORDER or not charged_by_spot(job.share)):
            return order
        groups = book.groups_for(job)
        spot = self.share_spot(job, groups, frozenset(), None, None, scratch=scratch)
        if spot is None:
            return order or Verdict(FREE, units=job.units, charges=charges)
        units, covered, charges = self._share_charges(job, spot, scratch, profile)
        if charges:
            v = self._hard(charges, scratch)
            if v is not None:
                return v
        if order is not None:
            return order
        if job.cohort is not None:
            hit = self._blocking(charges, True, scratch)
            if hit is not None:
                return Verdict(COHORT, limit=hit, units=units, charges=charges)
        avoided = book.avoided_nodes(job) if book.anti and job.cls.avoid else frozenset()
        if avoided and spot[0] in avoided:
            spot = self.share_spot(job, groups, avoided, None, None, scratch=scratch)
            if spot is None:
                return Verdict(ANTI, units=units, charges=charges)
            units, covered, charges = self._share_charges(job, spot, scratch, profile)
            if not self._limits_allow(job, charges, scratch):
                return Verdict(ANTI, units=units, charges=charges)
        if before_claims is not None:
            before_claims()
        self._exempt = profile.reclaimers_of(job) if profile and book.rules.cohorts else ()
        fresh = True
        if book.reserved:
            held = self._class_hold(job, GPU_UNITS, scratch)
            fresh = not held
            self._kept = self._kept_cards(job, scratch) if held and self._class_hold(job, 0, scratch) else {}
            holder = held if spot[3] else self._kept.get(spot[:2], "")
            if holder:
                # a shared card with room that no reservation counts on would not take
                # a reserved GPU
                card = self.share_spot(job, groups, avoided, None, None, fresh=False, scratch=scratch)
                if card is None:
                    return Verdict(CLASS_HOLD, holder=holder, units=units, charges=charges)
                spot = card
                units, covered, charges = self._share_charges(job, spot, scratch, profile)
                if not self._limits_allow(job, charges, scratch):
                    return Verdict(CLASS_HOLD, holder=holder, units=units, charges=charges)
        if profile:
            end = book.now + job.planned_run()
            skip = set(avoided)
            checked, moved_by = spot, None  # the spot whose charges rules 2 and 6 allowed
            if book.anti and job.cls.avoid:
                kept, first = profile.avoiding(job, end, self._exempt)
                if spot[0] in kept:  # its class would keep a claim's job off the claim's node
                    skip.update(kept)
                    spot = self.share_spot(job, groups, frozenset(skip), profile, end, fresh, scratch)
                    if spot is None:
                        return Verdict(CLAIMS, units=units, charges=charges, blocker=first)
                    moved_by = first
            delayed = None
            while spot is not None:
                # a card it would keep from coming free when a claim counts on it: the
                # next spot, that card aside (another card of the node may do: which card
                # is the tightest must not decide it, oracle seeds 168185, 172023); a fresh
                # GPU a claim needs: the rest of that node aside
                found = self._share_delays(job, profile, spot, end, scratch)
                if found is None:
                    if spot is checked:
                        break
                    units, covered, charges = self._share_charges(job, spot, scratch, profile)
                    if self._limits_allow(job, charges, scratch):
                        break
                    skip.add(spot[0])  # charged more there (a memory-only share): over a limit
                else:
                    delayed = delayed or found
                    if spot[3]:
                        skip.add(spot[0])
                    else:
                        self._kept = {**self._kept, spot[:2]: ""}
                spot = self.share_spot(job, groups, frozenset(skip), profile, end, fresh, scratch)
            if spot is None:
                return Verdict(CLAIMS, units=units, charges=charges, blocker=delayed or moved_by)
            units, covered, charges = self._share_charges(job, spot, scratch, profile)
            if self._quota_claimed(job, profile, charges, end, scratch):
                return Verdict(CLAIMS, units=units, charges=charges)
            if spot[3] and book.reserved:
                blocker = profile.class_blocker(job, 1, end, self._exempt)
                if blocker is not None:
                    return Verdict(CLAIMS, units=units, charges=charges, blocker=blocker)
        return Verdict(ADMITTED, spot=spot, units=units, charges=charges, covered=covered)

    def _limits_allow(self, job: Job, charges: tuple, scratch: Scratch | None) -> bool:
        """Whether no hard limit (rule 2) nor cohort capacity (rule 6) refuses ``charges``
        - those of another spot than the first a share found: a memory-only share is
        charged by the card it lands on (oracle seed 191757: moved off a card a claim
        needed to a smaller one, it went over its team's limit)."""
        if not charges:
            return True
        return self._hard(charges, scratch) is None and (
            job.cohort is None or self._blocking(charges, True, scratch) is None)

    def _kept_cards(self, job: Job, scratch: Scratch | None) -> dict[tuple[int, int], str]:
        """Rule 8 for a share joining a card: ``(node, GPU) -> class`` of the shared cards
        (not MIG) that only jobs of one other class with ``reserved_gpus`` hold (``scratch``'s
        victims gone) while that class holds less than its reservation. Called when the
        free GPUs do not cover the unused part of every other class's reservation. Such a
        card counts whole towards its class's reservation (it is out of the free GPUs for
        it, the oracle's ``d_reserved``); a share of another class joining it would make
        the card count only by the class's own shares and leave the reservation short with
        no free GPU for the rest - as a fresh GPU would (design note 042, "Class
        reservations")."""
        book = self.book
        gone = {v.id for v in scratch.victims} if scratch is not None else ()
        slots = book.ledger.slots
        kept: dict[tuple[int, int], str] = {}
        for name, res in book.reserved.items():
            if name == job.cls.name:
                continue
            used = book.class_units.get(name, 0) - (scratch.class_units.get(name, 0) if scratch is not None else 0)
            if used >= res:
                continue
            for j in book.class_jobs.get(name, {}).values():
                if j.share is None or len(j.share_at) != 1 or j.id in gone:
                    continue
                at = (j.alloc[0][0], j.share_at[0])
                card = slots[at[0]].cards.get(at[1])
                if card is not None and at not in kept and all(
                        h in gone or book.jobs[h].cls.name == name for h in card.holders):
                    kept[at] = name
        return kept

    def _share_delays(self, job: Job, profile: Profile, spot: tuple, end: float,
                      scratch: Scratch | None) -> Claim | None:
        """The claim a share on ``spot`` until ``end`` would delay (``None``: none): a
        fresh GPU the claims need, or - joining a card - the hold of a preemptor whose
        victims hold the card (note 042), or keeping its GPU from coming free from the
        card's planned end on, where a claim point counts on it."""
        n = spot[0]
        if spot[3]:
            if self._cap(job, profile, n, end, scratch) >= 1:
                return None
            return self._claim_on(job, profile, n, end)
        if spot[2] is not None:
            return None  # a MIG instance: its GPU is never handed out whole
        for c in profile.claims:  # a card a preemptor's victims are leaving (note 042)
            if c.cards and c.job_id != job.id and c not in self._exempt and (n, spot[1]) in c.cards:
                return c
        free_from = self.card_end(n, spot[1], scratch)
        if end <= free_from:
            return None
        now = self.book.now
        for p in profile.binding_points(end):
            if max(p, now) < free_from:  # a point of the last pass before now stands for now
                continue
            s = profile.spare[p].get(n)
            if s is not None:
                s += sum(c.gpus.get(n, 0) for c in self._exempt if c.start <= p < c.end)
                if s < 1:
                    return next((c for c in profile.owners[p] if n in c.gpus and c not in self._exempt),
                                None) or self._claim_on(job, profile, n, end)
        book = self.book
        if book.reserved and job.cls.name not in book.reserved:
            # the card's GPU counted in the class-hold slack of a reservation starting
            # once it would be free: kept, the reservation may find only reserved GPUs
            for c in profile.claims:
                if (not c.hold and c.gslack is not None and c.job_id != job.id and c not in self._exempt
                        and free_from <= c.start < end and c.gslack < 1):
                    return c
        return None

    def _claim_on(self, job: Job, profile: Profile, n: int, end: float) -> Claim | None:
        """The first claim (holds first, then reservations in order) on node ``n`` that a
        run of ``job`` ending at ``end`` overlaps, not one that does not bind it."""
        return next((c for c in profile.claims if c.job_id != job.id and c not in self._exempt
                     and c.gpus.get(n, 0) and (c.hold or c.start < end)), None)

    def card_end(self, n: int, g: int, scratch: Scratch | None = None) -> float:
        """When the shared card ``g`` of node ``n`` is planned to come free (its last
        holder's planned end - ``scratch``'s victims gone - now at the earliest)."""
        book = self.book
        card = book.ledger.slots[n].cards.get(g)
        if card is None:
            return book.now
        gone = {v.id for v in scratch.victims} if scratch is not None else ()
        return max([book.now] + [book.jobs[h].end_est for h in card.holders if h not in gone])

    def _share_charges(self, job: Job, spot: tuple, scratch: Scratch | None = None,
                       profile: Profile | None = None) -> tuple[int, int, tuple]:
        """``(units, covered, charges)`` of a share on ``spot``: a memory-only share is
        charged its memory over the card's, an MPS share without an SM percentage 1 /
        the node's ``max_clients`` per replica (note 037)."""
        share = job.share
        units = job.units
        if charged_by_spot(share):
            units = units_of(self.book, job.spec, job.shape.ckey, self.book.ledger.slots[spot[0]].node)
        covered, charges = self._charged(job, units, scratch, profile)
        return units, covered, charges

    def share_spot(self, job: Job, groups: list[int], avoided: frozenset, profile: Profile | None,
                   end: float | None, fresh: bool = True, scratch: Scratch | None = None) -> tuple | None:
        """Where a share goes: ``(node index, GPU, MIG instance position or None, opens a
        fresh GPU)``. Nodes holding the job's cache key first (when it names one); within
        them the tightest card that fits, else (``fresh``) a whole free GPU by best fit on
        a node where the claims of ``profile`` leave one; none, on ``scratch``: where its
        victims leave room (``_scratch_spot``)."""
        spec = job.spec
        ledger = self.book.ledger
        tiers = [groups]
        if spec.cache_key and not spec.cache_required:
            cached = [g for g in groups if spec.cache_key in ledger.groups[g].node.cached]
            if cached and len(cached) < len(groups):
                tiers = [cached, [g for g in groups if g not in cached]]
        for tier in tiers:
            spot = self._share_spot_in(job, tier, avoided, profile, end, fresh)
            if spot is not None:
                return spot
        if scratch is not None and (scratch.relief or scratch.freed):
            return self._scratch_spot(job, groups, avoided, profile, end, fresh, scratch)
        return None

    def _scratch_spot(self, job: Job, groups: list[int], avoided: frozenset, profile: Profile | None,
                      end: float | None, fresh: bool, scratch: Scratch) -> tuple | None:
        """Where a share (not MIG) goes once ``scratch``'s victims are gone and no card or
        free GPU takes it now (a share preemptor's plan, note 042): the tightest card of
        its kind they leave room on (room left, then node and GPU), else (``fresh``) a GPU
        they leave empty, on the lowest node where the claims of ``profile`` leave one."""
        ledger = self.book.ledger
        share = job.share
        if share.kind == "mig":
            return None
        nodes = {i for i in members_of(ledger, groups) if i not in avoided}
        best = None
        for (n, g), (dm, dmem, dslots) in scratch.relief.items():
            card = ledger.slots[n].cards.get(g)
            if n not in nodes or card is None or card.mode != share.kind or not card.key or (n, g) in self._kept:
                continue
            milli, mem, slots = share.need(ledger.slots[n].node)
            used_m, used_mem, used_s = card.milli - dm + milli, card.mem - dmem + mem, card.slots - dslots + slots
            if used_m > FULL_MILLI or used_mem > card.cap_mem or (card.cap_slots and used_s > card.cap_slots):
                continue
            primary = card.cap_slots - used_s if share.kind == "time_slice" else FULL_MILLI - used_m
            key = (primary, card.cap_mem - used_mem, n, g)
            if best is None or key < best:
                best = key
        if best is not None:
            return best[2], best[3], None, False
        if not fresh:
            return None
        for n in sorted(scratch.freed):
            node = ledger.slots[n].node
            if (n in nodes and share_fits_card(node, share)
                    and not (profile and self._cap(job, profile, n, end, scratch) < 1)):
                mask = pick_gpus(scratch.freed[n], 1, node.nvlink_islands)
                return n, mask.bit_length() - 1, None, True
        return None

    def _share_spot_in(self, job: Job, groups: list[int], avoided: frozenset, profile: Profile | None,
                       end: float | None, fresh: bool) -> tuple | None:
        ledger = self.book.ledger
        share = job.share
        if share.kind == "mig":
            found = ledger.best_mig(groups, share.profile, avoided)
            return None if found is None else (found[0], found[1], found[2], False)
        found = best_card_for(ledger, groups, share, avoided, cards=self._kept)
        if found is not None:
            return found[0], found[1], None, False
        if not fresh:
            return None
        fits = [g for g in groups if share_fits_card(ledger.groups[g].node, share)]
        if not fits or ledger.free_in(fits) == 0:
            return None
        idx = ledger.best_fit(fits, 1)
        if idx is not None and (idx in avoided or (profile and self._cap(job, profile, idx, end, None) < 1)):
            idx = None
            for cand in sorted(members_of(ledger, fits), key=lambda i: (ledger.slots[i].free, i)):
                if (ledger.slots[cand].free and cand not in avoided
                        and not (profile and self._cap(job, profile, cand, end, None) < 1)):
                    idx = cand
                    break
        if idx is None:
            return None
        return idx, pins.pick_free(self.book, idx, 1, job).bit_length() - 1, None, True


def best_card_for(ledger, groups: list[int], share, exclude: frozenset = frozenset(),
                  memory: bool = True, cards=()) -> tuple[int, int] | None:
    """``Ledger.best_card`` for ``share`` (not ``mig``): what it needs of a card on each
    node - an MPS share without an SM percentage or memory takes the node's defaults
    (note 037) - so the groups are asked per need and the tightest card of all wins;
    ``memory`` False: as if it declared no memory; ``cards``: ``(node index, GPU)`` pairs
    it may not join (rule 8). ``(node index, GPU)`` or ``None``."""
    if share.kind != "mps" or (share.milli and share.mem_mib):
        milli, mem, slots = share.need()
        return ledger.best_card(groups, share.kind, milli, mem if memory else 0, slots, exclude, cards)
    by_need: dict[tuple, list[int]] = {}
    for g in groups:
        by_need.setdefault(share.need(ledger.groups[g].node), []).append(g)
    best = None
    for (milli, mem, slots), gs in by_need.items():
        hit = ledger.best_card(gs, share.kind, milli, mem if memory else 0, slots, exclude, cards)
        if hit is not None:
            key = ledger.slots[hit[0]].cards[hit[1]].key
            if best is None or key < best[0]:
                best = (key, hit)
    return None if best is None else best[1]
