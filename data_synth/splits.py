"""Which trajectories go to which split, so that no screenshot lands in two splits.

The unit of a split is a group of trajectories: trajectories that share a screenshot (the same scorer
image: one episode in two layouts, a page every run passes through) are one group and go to one split
together. With agent lists (``SplitConfig.agents``) each group goes where its agents are listed (a
group whose agents are listed in different splits goes where most of its rows are). With fractions,
groups are split by agent first: agents whose groups touch are one unit, and units are dealt out to
the splits in row proportions. When that cannot meet the requested fractions (a split left empty, a
share off by more than ``tolerance``, or groups whose agent is unknown) the builder says so and falls
back to task groups (trajectories of one task text, joined with their screenshot groups), keeping
each group in its agent's split where that split still has room.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from keyshot.data_synth.labels import TrajectoryRecord

logger = logging.getLogger(__name__)

SPLIT_ORDER = ("train", "validation", "test")
UNKNOWN_AGENT = "unknown"


def split_rank(split: str) -> tuple[int, str]:
    """Sort key of split names: train, validation, test, then the others by name."""
    return (SPLIT_ORDER.index(split) if split in SPLIT_ORDER else 99, split)


@dataclass
class SplitConfig:
    """``agents``: split name → agent names (agents listed nowhere are left out, and reported).
    Without ``agents``, groups are dealt out in the proportions of ``fractions`` (see the module doc);
    ``tolerance`` is how far a split's share of the rows may be off before the agent split gives way
    to task groups."""

    agents: dict[str, list[str]] = field(default_factory=dict)
    fractions: dict[str, float] = field(
        default_factory=lambda: {"train": 0.6, "validation": 0.2, "test": 0.2}
    )
    seed: int = 0
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for split, names in self.agents.items():
            for name in names:
                if name in seen:
                    raise ValueError(
                        f"splits.agents: agent {name!r} is listed in both {seen[name]!r} and {split!r}"
                    )
                seen[name] = split
        if not self.agents and (
            not self.fractions
            or any(v < 0 for v in self.fractions.values())
            or sum(self.fractions.values()) <= 0
        ):
            raise ValueError("splits.fractions must give each split a share >= 0, with a positive total")
        if not 0 <= self.tolerance <= 1:
            raise ValueError("splits.tolerance must be between 0 and 1")

    def shares(self) -> dict[str, float]:
        total = sum(self.fractions.values())
        return {s: f / total for s, f in sorted(self.fractions.items(), key=lambda kv: split_rank(kv[0]))}


def _hash(seed: int, name: str) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def allocate(
    units: dict[str, int], shares: dict[str, float], seed: int, prefer: dict[str, str] | None = None
) -> dict[str, str]:
    """Unit → split, for units of ``units[u]`` rows. Largest units first (ties by a seeded hash), each
    to its ``prefer`` split while that split has room for at least half of it, else to the split
    furthest below its share. Every split with a positive share gets a unit when there are enough."""
    prefer = prefer or {}
    total = sum(units.values())
    target = {s: share * total for s, share in shares.items()}
    rows = dict.fromkeys(shares, 0)
    used = dict.fromkeys(shares, 0)
    positive = [s for s, share in shares.items() if share > 0]
    order = sorted(units, key=lambda u: (-units[u], _hash(seed, u)))
    out: dict[str, str] = {}
    for i, unit in enumerate(order):
        empty = [s for s in positive if used[s] == 0]
        candidates = empty if empty and len(order) - i <= len(empty) else positive
        wanted = prefer.get(unit)
        if wanted in candidates and target[wanted] - rows[wanted] >= units[unit] / 2:
            split = wanted
        else:  # the split furthest below its share (ties: the first in split order)
            split = min(candidates, key=lambda s: (rows[s] - target[s], split_rank(s)))
        out[unit] = split
        rows[split] += units[unit]
        used[split] += 1
    return out


class _Groups:
    """Union-find over hashable items."""

    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, items: Iterable) -> None:
        items = list(items)
        for other in items[1:]:
            a, b = self.find(items[0]), self.find(other)
            if a != b:
                self.parent[max(a, b)] = min(a, b)

    def groups(self, items: Iterable) -> dict:
        """Root → its members among ``items`` (sorted)."""
        out: dict = {}
        for x in sorted(items):
            out.setdefault(self.find(x), []).append(x)
        return out


@dataclass
class SplitPlan:
    """Where each trajectory goes, and what the report needs to say about it."""

    split_of: dict[str, str]  # trajectory uid → split (absent: in no split)
    unit: str  # "agent", "task group" or "agent lists"
    reason: str = ""  # why the agent split gave way to task groups
    requested: dict[str, float] = field(default_factory=dict)
    planned: dict[str, float] = field(default_factory=dict)  # row shares before class balance
    groups: int = 0
    shared_screenshots: int = 0  # distinct screenshots seen in more than one trajectory
    grouped_trajectories: int = 0  # trajectories kept with another because they share a screenshot
    moved: int = 0  # trajectories placed outside their agent's split to keep a group whole

    def as_dict(self) -> dict:
        return {
            "unit": self.unit,
            "reason": self.reason,
            "requested": self.requested,
            "planned": self.planned,
            "groups": self.groups,
            "shared_screenshots": self.shared_screenshots,
            "grouped_trajectories": self.grouped_trajectories,
            "moved": self.moved,
        }


def _shares(split_of: dict[str, str], rows: dict[str, int], names: Iterable[str]) -> dict[str, float]:
    per = Counter()
    for uid, split in split_of.items():
        per[split] += rows.get(uid, 0)
    total = sum(per.values()) or 1
    return {s: round(per[s] / total, 4) for s in sorted(set(names) | set(per), key=split_rank)}


def _shortfall(planned: dict[str, float], shares: dict[str, float], tolerance: float) -> str:
    empty = [s for s, share in shares.items() if share > 0 and not planned.get(s)]
    if empty:
        return f"split(s) {', '.join(empty)} would get no row"
    off = {s: planned.get(s, 0.0) - share for s, share in shares.items()}
    worst = max(off, key=lambda s: abs(off[s]))
    if abs(off[worst]) > tolerance:
        return (
            f"split {worst} would get {planned.get(worst, 0.0):.2f} of the rows for a requested "
            f"{shares[worst]:.2f} (tolerance {tolerance})"
        )
    return ""


def _agent(traj: TrajectoryRecord) -> str:
    return traj.agent or UNKNOWN_AGENT


def _known_agent(traj: TrajectoryRecord) -> str | None:
    return traj.agent if traj.agent and traj.agent != UNKNOWN_AGENT else None


def _majority(votes: Counter) -> str:
    """The split with the most rows (ties: the first in split order)."""
    return min(votes, key=lambda s: (-votes[s], split_rank(s)))


def plan_splits(
    trajectories: dict[str, TrajectoryRecord],
    screenshots: dict[str, list[str | None]],
    rows: dict[str, int],
    cfg: SplitConfig,
) -> SplitPlan:
    """Split the trajectories in ``rows`` (uid → its rows, identical rows counted once: a trajectory
    whose rows all repeat another's has 0); ``screenshots[uid]``: the content hash of each of its
    screenshots (None where unreadable). Trajectories not in ``rows`` get no split."""
    uids = sorted(u for u in rows if u in trajectories)
    links = _Groups()
    holders: dict[str, set[str]] = {}
    for uid in uids:
        for digest in screenshots.get(uid, []):
            if digest is not None:
                holders.setdefault(digest, set()).add(uid)
    for holder in holders.values():
        links.join(sorted(holder))
    groups = links.groups(uids)
    overlap = {
        "groups": len(groups),
        "shared_screenshots": sum(len(h) > 1 for h in holders.values()),
        "grouped_trajectories": sum(len(g) for g in groups.values() if len(g) > 1),
    }
    if cfg.agents:
        return _by_lists(trajectories, groups, rows, cfg, overlap)
    shares = cfg.shares()
    unit_of_group, unit_of_agent = _agent_units(trajectories, groups)
    unit_rows: Counter = Counter()
    for root, unit in unit_of_group.items():
        unit_rows[unit] += sum(rows[u] for u in groups[root])
    unit_split = allocate(dict(unit_rows), shares, cfg.seed)
    split_of = {u: unit_split[unit_of_group[root]] for root in unit_of_group for u in groups[root]}
    planned = _shares(split_of, rows, shares)
    reason = _shortfall(planned, shares, cfg.tolerance)
    unknown = len(uids) - len(split_of)
    if unknown:
        reason = f"{unknown} trajectories have no known agent" + (f"; {reason}" if reason else "")
    if not reason:
        return SplitPlan(split_of, "agent", "", shares, planned, **overlap)
    logger.warning(
        "splitting by agent cannot meet the requested fractions (%s): splitting by task groups instead",
        reason,
    )
    agent_split = {a: unit_split[unit] for a, unit in unit_of_agent.items()}
    split_of, n_groups, moved = _by_tasks(trajectories, links, uids, rows, shares, cfg.seed, agent_split)
    planned = _shares(split_of, rows, shares)
    still = _shortfall(planned, shares, cfg.tolerance)
    if still:
        logger.warning("task groups cannot meet the requested fractions either: %s", still)
    overlap["groups"] = n_groups
    return SplitPlan(split_of, "task group", reason, shares, planned, moved=moved, **overlap)


def _agent_units(trajectories: dict[str, TrajectoryRecord], groups: dict) -> tuple[dict, dict[str, str]]:
    """Agents whose screenshot groups touch are one unit (named by its agents). Returns group root →
    unit for the groups with a known agent, and agent → unit."""
    known_of = {
        root: sorted({a for a in (_known_agent(trajectories[u]) for u in members) if a})
        for root, members in groups.items()
    }
    agents = _Groups()
    for known in known_of.values():
        agents.join(known)
    names = {a for known in known_of.values() for a in known}
    unit_of_agent = {a: "+".join(members) for members in agents.groups(names).values() for a in members}
    unit_of_group = {root: unit_of_agent[known[0]] for root, known in known_of.items() if known}
    return unit_of_group, unit_of_agent


def _by_tasks(
    trajectories: dict[str, TrajectoryRecord],
    links: _Groups,
    uids: list[str],
    rows: dict[str, int],
    shares: dict[str, float],
    seed: int,
    agent_split: dict[str, str],
) -> tuple[dict[str, str], int, int]:
    """Task groups (one task text, joined with the screenshot groups) dealt out by rows, each kept in
    the split its agents got where there is room. Returns uid → split, the number of groups and the
    trajectories of a known agent placed outside their agent's split."""
    for uid in uids:  # "\0" never starts a uid: task keys and uids cannot collide
        links.join([uid, "\0task:" + " ".join(trajectories[uid].task.split())])
    groups = links.groups(uids)
    prefer = {}
    for root, members in groups.items():
        votes: Counter = Counter()
        for u in members:
            agent = _known_agent(trajectories[u])
            if agent is not None:
                votes[agent_split[agent]] += rows[u]
        if votes:
            prefer[root] = _majority(votes)
    chosen = allocate({root: sum(rows[u] for u in g) for root, g in groups.items()}, shares, seed, prefer)
    split_of = {u: chosen[root] for root, g in groups.items() for u in g}
    moved = sum(
        1
        for u, split in split_of.items()
        if (agent := _known_agent(trajectories[u])) is not None and agent_split[agent] != split
    )
    return split_of, len(groups), moved


def _by_lists(
    trajectories: dict[str, TrajectoryRecord],
    groups: dict,
    rows: dict[str, int],
    cfg: SplitConfig,
    overlap: dict,
) -> SplitPlan:
    """Each group to the split its agents are listed in; a group whose agents are listed in different
    splits goes where most of its rows are (its other listed trajectories are counted as moved)."""
    listed = {a: split for split, names in cfg.agents.items() for a in names}
    split_of: dict[str, str] = {}
    moved = 0
    for members in groups.values():
        votes: Counter = Counter()
        for u in members:
            if _agent(trajectories[u]) in listed:
                votes[listed[_agent(trajectories[u])]] += rows[u]
        if not votes:
            continue
        split = _majority(votes)
        for u in members:
            own = listed.get(_agent(trajectories[u]))
            if own is not None:
                split_of[u] = split
                moved += own != split
    planned = _shares(split_of, rows, cfg.agents)
    return SplitPlan(split_of, "agent lists", "", {}, planned, moved=moved, **overlap)
