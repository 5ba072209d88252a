"""The cluster as the planner sees it: the standalone scheduler's books (``doctor.books.Books``
of a snapshot of the API, or of a snapshot file) and the PodDisruptionBudgets as the planner's
disruption budgets (``k8s.disruption.BudgetReader``, listed once; none for a file: it holds no
budgets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpusched.core.defrag import DisruptionBudget
from gpusched.doctor.books import Books


@dataclass
class ClusterView:
    books: Books
    budgets: tuple[DisruptionBudget, ...] = ()
    invalid: dict[str, str] = field(default_factory=dict)
    """Budgets that could not be read (``pdb/NS/NAME`` -> why)."""


def read_view(
    kubeconfig: str | None = None, snapshot: Path | None = None, policy: str = "default"
) -> ClusterView:
    """Read the live API (``kubeconfig``, else ``$KUBECONFIG``, else in-cluster) or ``snapshot``.
    Raises ApiUnreachable naming the server or kubeconfig when the API cannot be read."""
    from gpusched.doctor.snapshot import load_snapshot
    from gpusched.doctor.source import from_api

    if snapshot is not None:
        return ClusterView(Books.of(load_snapshot(snapshot), policy))
    books = Books.of(from_api(kubeconfig, queues=False), policy)  # moves ignore queues
    budgets, invalid = _api_budgets(kubeconfig)
    return ClusterView(books, budgets, {f"pdb/{k}": v for k, v in invalid.items()})


def _api_budgets(kubeconfig: str | None) -> tuple[tuple[DisruptionBudget, ...], dict[str, str]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpusched.doctor.errors import ApiUnreachable
    from gpusched.k8s.client import api_client
    from gpusched.k8s.disruption import BudgetReader

    api = api_client(kubeconfig)  # the snapshot just loaded it: it loads
    where = f"Kubernetes API at {api.configuration.host}: PodDisruptionBudgets"
    reader = BudgetReader(client.PolicyV1Api(api))
    try:
        reader.reflector.list_once()
    except ApiException as e:
        raise ApiUnreachable(f"{where}: {e.status} {e.reason}") from None
    except (HTTPError, OSError) as e:
        raise ApiUnreachable(f"{where}: {type(e).__name__}: {e}") from None
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return reader.budgets().budgets, dict(reader.invalid)
