"""A gang's topology request, read from its pods' and its group's annotations (``core.gangtopology``).

The form follows Kueue's Topology Aware Scheduling (``kueue.x-k8s.io/podset-required-topology`` /
``podset-preferred-topology``) and KAI's ``topology-required-placement`` /
``topology-preferred-placement``: the value is the node label key of one level of the hierarchy
the scheduler is configured with (``--gang-topology-levels``, narrowest first)::

    gpusched.io/topology-required: nvidia.com/gpu.clique    # all members in one NVLink domain, or wait
    gpusched.io/topology-preferred: nvidia.com/gpu.clique   # one clique if possible, else one rack, ...

on the gang's pods (as Kueue users write it on the pod template) or on its group object. Bad input
is refused with a message naming it (``InvalidTopology``; the scheduler sends it as the group's
``InvalidGangTopology`` event and each pod's ``FailedScheduling``):

- a key that is not one of the configured levels;
- both annotations on one object;
- members (or a member and the group) asking for different requests; members that say nothing
  follow the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpusched.core.gangtopology import GangTopology, InvalidTopology, Mode, TopologyLevels
from gpusched.core.names import ANN_TOPOLOGY_PREFERRED, ANN_TOPOLOGY_REQUIRED

_MODES = ((ANN_TOPOLOGY_REQUIRED, Mode.REQUIRED), (ANN_TOPOLOGY_PREFERRED, Mode.PREFERRED))


def _asked(what: str, annotations: Mapping[str, Any]) -> tuple[str, str] | None:
    """(annotation, key) that ``annotations`` carry, None when neither; both: InvalidTopology."""
    given = [(name, str(annotations[name]).strip()) for name, _ in _MODES if name in annotations]
    if len(given) > 1:
        raise InvalidTopology(
            f"{what}: both {ANN_TOPOLOGY_REQUIRED} and {ANN_TOPOLOGY_PREFERRED} are set; keep one"
        )
    return given[0] if given else None


def gang_topology(
    levels: TopologyLevels,
    group: tuple[str, Iterable[tuple[str, str]]],
    members: Iterable[tuple[str, Mapping[str, Any]]],
) -> GangTopology | None:
    """The request of a gang: ``group`` (its description, its topology annotations) and ``members``
    (pod key, pod annotations). None when nobody asks; InvalidTopology (naming the objects and the
    annotation) when the input is bad."""
    seen: list[tuple[str, tuple[str, str]]] = []
    gname, gann = group
    if (g := _asked(gname, dict(gann))) is not None:
        seen.append((gname, g))
    for key, ann in members:
        if (m := _asked(f"pod {key}", ann)) is not None:
            seen.append((f"pod {key}", m))
    if not seen:
        return None
    first_who, first = seen[0]
    for who, asked in seen[1:]:
        if asked != first:
            raise InvalidTopology(
                f"{first_who} asks {first[0]}: {first[1]} but {who} asks {asked[0]}: {asked[1]}; "
                "a gang's members must ask for one topology"
            )
    name, key = first
    mode = dict(_MODES)[name]
    try:
        return levels.request(mode, key)
    except InvalidTopology as e:
        raise InvalidTopology(
            f"{first_who}: {name}: {key!r} is not one of the topology levels ({', '.join(levels.keys)})"
        ) from e
