"""Doctor's errors: each names what is wrong; the command line prints it and exits 2."""

from __future__ import annotations

from gpusched.core.errors import GpuschedError, InvalidInput, ResourceError


class DoctorError(GpuschedError):
    """The root of doctor's own errors."""


class UnknownObject(DoctorError, InvalidInput):
    """A pod or node that the cluster (or the snapshot) does not have."""


class SnapshotError(DoctorError, InvalidInput):
    """A snapshot file that cannot be read as one (the message names the file and the field)."""


class ApiUnreachable(DoctorError, ResourceError):
    """The Kubernetes API cannot be used: no kubeconfig, refused, timed out, forbidden."""
