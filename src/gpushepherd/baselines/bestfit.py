"""Plain node best-fit for shared GPUs: the Kubernetes-style "least allocated resources
remaining" rule, the Best-fit baseline of GPU-sharing schedulers (Weng et al., "Beware
of Fragmentation", USENIX ATC'23, section 6; ``BestFitScore`` of
hkust-adsl/kubernetes-scheduler-simulator).

A share (``fraction``, ``time_slice``, ``mps``) goes to the feasible node with the least
*summed* free GPU capacity - free whole GPUs plus the room left on its shared cards, in
milli-GPU - ties by lowest node index; on that node, the first GPU (lowest index) that
fits: a shared card of the same mode with room, or a free whole GPU. gpushepherd's own
rule instead takes the tightest card anywhere in the cluster (design note 007), so that
small leftovers are filled before a whole GPU is broken.

Everything else is gpushepherd's core: whole-GPU pods go to the node with the fewest
free whole GPUs (for a one-node pod this is best-fit too; it differs from summed-free
best-fit only in ties between nodes whose shared cards have different room left), MIG
instances to the tightest MIG card, and queueing, quotas and reservations are unchanged.

Two differences from the ATC'23 artifact's Best-fit: its node score also weighs free
CPU (0.5 CPU, 0.5 GPU; gpushepherd schedules GPUs only), and on the chosen node it
takes the tightest GPU (its ``gpuSelMethod`` default ``best``), not the first.
"""

from __future__ import annotations

from gpushepherd.core import Scheduler
from gpushepherd.core.admission import Admission
from gpushepherd.core.filters import share_fits_card
from gpushepherd.core.ledger import FULL_MILLI, NodeSlot, ShareCard
from gpushepherd.core.placement import members_of
from gpushepherd.model.rules import Rules


def card_free_milli(card: ShareCard) -> int:
    """Room left on a shared card in milli-GPU (time-slicing: the free replicas' share)."""
    if card.mode == "time_slice" and card.cap_slots:
        return (card.cap_slots - card.slots) * FULL_MILLI // card.cap_slots
    return FULL_MILLI - card.milli


def node_free_milli(slot: NodeSlot) -> int:
    """A node's summed free GPU capacity in milli-GPU: free whole GPUs and the room on
    its healthy shared cards (0 for a lost node)."""
    if not slot.alive:
        return 0
    return slot.free * FULL_MILLI + sum(card_free_milli(c) for c in slot.cards.values() if c.key)


class BestFitAdmission(Admission):
    """gpushepherd's admission rule with node best-fit placement of shares (see the module
    docstring).

    Each node's summed free capacity and the largest room of its cards per mode are
    kept from the ledger's change log (and the node's health mask: a shared card that
    turns unhealthy is not in that log), so a placement scans the candidate nodes once,
    looking inside a node only when it may fit."""

    def __init__(self, book):
        super().__init__(book)
        self._bf_free: list[int] = []
        self._bf_room: list[dict[str, int]] = []
        self._bf_health: list[int] = []
        self._bf_pos = 0

    def _bf_node(self, idx: int) -> None:
        slot = self.book.ledger.slots[idx]
        self._bf_free[idx] = node_free_milli(slot)
        self._bf_health[idx] = slot.healthy_mask
        room: dict[str, int] = {}
        if slot.alive:
            for card in slot.cards.values():
                if card.key:
                    primary = card.room()[0]
                    if primary > room.get(card.mode, -1):
                        room[card.mode] = primary
        self._bf_room[idx] = room

    def _bf_sync(self) -> None:
        ledger = self.book.ledger
        changes = ledger.changes
        old = len(self._bf_free)
        if old < len(ledger.slots):
            self._bf_free.extend([0] * (len(ledger.slots) - old))
            self._bf_room.extend({} for _ in range(len(ledger.slots) - old))
            self._bf_health.extend([0] * (len(ledger.slots) - old))
            for idx in range(old, len(ledger.slots)):
                self._bf_node(idx)
        if self._bf_pos < len(changes):
            for idx in set(changes[self._bf_pos:]):
                self._bf_node(idx)
            self._bf_pos = len(changes)

    def _share_spot_in(self, job, groups, avoided, profile, end, fresh):
        share = job.share
        if share.kind == "mig":
            return super()._share_spot_in(job, groups, avoided, profile, end, fresh)
        ledger = self.book.ledger
        kind = share.kind
        self._bf_sync()
        free, rooms, health, slots = self._bf_free, self._bf_room, self._bf_health, ledger.slots
        cand = [i for i in members_of(ledger, groups) if i not in avoided]  # live nodes, ascending
        for idx in cand:
            if slots[idx].healthy_mask != health[idx]:
                self._bf_node(idx)
        fresh_ok = {g: fresh and share_fits_card(ledger.groups[g].node, share) for g in groups}

        def fresh_allowed(idx: int) -> bool:
            return not profile or self._cap(job, profile, idx, end, None) >= 1

        best = None
        best_free = 0
        for idx in cand:
            f = free[idx]
            if best is not None and f >= best_free:
                continue  # ties: the lower index (candidates are ascending)
            slot = slots[idx]
            need = share.need(slot.node)  # an MPS share's defaults are the node's (note 037)
            primary = need[2] if kind == "time_slice" else need[0]
            if rooms[idx].get(kind, -1) < primary and not (slot.free and fresh_ok[slot.group]):
                continue  # no card with room enough, no whole GPU to open
            if _first_fit(slot, kind, need, fresh_ok[slot.group], fresh_allowed, self._kept) is not None:
                best, best_free = idx, f
        if best is None:
            return None
        slot = ledger.slots[best]
        gpu, opens = _first_fit(slot, kind, share.need(slot.node), fresh_ok[slot.group], fresh_allowed, self._kept)
        return best, gpu, None, opens


def _first_fit(slot: NodeSlot, kind: str, need: tuple[int, int, int], fresh_ok: bool,
               fresh_allowed, kept=()) -> tuple[int, bool] | None:
    """``(GPU, opens a fresh GPU)`` of the lowest-index GPU of ``slot`` that can take the
    share (not a card in ``kept``: ``(node index, GPU)`` pairs rule 8 keeps it off), or
    ``None``."""
    allowed = None
    for g in range(slot.total):
        card = slot.cards.get(g)
        if card is not None:
            if card.key and card.mode == kind and card.fits(*need) and (slot.idx, g) not in kept:
                return g, False
        elif slot.free_mask >> g & 1 and fresh_ok:
            if allowed is None:
                allowed = fresh_allowed(slot.idx)
            if allowed:
                return g, True
    return None


class NodeBestFit(Scheduler):
    """gpushepherd's core with node best-fit placement of shares (``BestFitAdmission``)."""

    admission_class = BestFitAdmission


def baseline(rules: Rules):
    """``(rules, NodeBestFit)``: the policy as written, shares placed by node best-fit."""
    return rules, NodeBestFit
