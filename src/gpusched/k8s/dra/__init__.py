"""Dynamic Resource Allocation on the real API: resource.k8s.io/v1 objects to the core's typed model
(``convert``), the DRA books kept from informers (``books``), a pod's claims resolved (``podclaims``),
and ``status.allocation``/``status.reservedFor`` written before the binding (``writer``). The
allocation itself is the core's (``gpusched.core.dra``, run per node by the DynamicResources plugin).
See docs/dra.md."""
