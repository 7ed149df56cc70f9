"""Who is asking: one `Caller`, resolved once by the request gate from the key sent, and read by the
routes, the fair queue, the ledger, the budgets and the dashboard.

The gate names it on the request's record (classroom/request_record.py); the routes read it there and
hand it down explicitly, with the record, to the backend that names the request for the fair queue. It
never holds the key itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.classroom.limits import Limits
from kinetic.classroom.roles import Role

# The admin (the instructor) is served before students while waiting, unless the key file says otherwise.
ADMIN_PRIORITY = 1


@dataclass(frozen=True)
class Caller:
    name: str | None  # the key's name; None on a server without keys, or for a key the gate refused
    role: Role
    limits: Limits = field(default_factory=Limits)
    addr: str = ""  # the client's address: a server without keys tells callers apart by it

    @property
    def queue_name(self) -> str:
        """The name the fair queue and the in-flight counts go by: the key's, else the address."""
        if self.name:
            return self.name
        return f"addr:{self.addr}" if self.addr else "anonymous"

    @property
    def priority(self) -> int:
        if self.limits.priority is not None:
            return self.limits.priority
        return ADMIN_PRIORITY if self.role is Role.ADMIN and self.name is not None else 0


NOBODY = Caller(None, Role.STUDENT)  # outside any request (a test calling a backend directly)


# A batch's line (kinetic/classroom/request_record.py's BATCH_SCOPE): the gate makes its Caller from the owner's key
# entry now (its budget, its hours), below every live request in the waiting line.
BATCH_PRIORITY = -(2**31)


@dataclass(frozen=True)
class BatchOrigin:
    batch_id: str
    custom_id: str
    owner: str | None  # the name of the key that made the batch (None on a server without keys)
    admin: bool  # that key's role then
