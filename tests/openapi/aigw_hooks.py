"""schemathesis hooks for tests/openapi/run.

The admin run signs in as an owner and may change any member: resetting the password of, demoting
or deactivating that owner (or the member owning the gateway key) would revoke the run's own
credentials and leave every later request a 401. Those members' ids are never generated for the
member routes; every other id is.
"""

import os

import schemathesis

PROTECTED = {int(x) for x in os.environ.get("AIGW_ST_PROTECTED_MEMBERS", "").split(",") if x}


@schemathesis.hook
def filter_path_parameters(ctx, path_parameters):
    operation = getattr(ctx, "operation", None)
    if operation is None or not operation.path.startswith("/admin/v1/members/"):
        return True
    return not path_parameters or path_parameters.get("id") not in PROTECTED
