"""HTTP routes, one module per resource; each router owns its prefix.

Every API path starts with API_PREFIX, but the Personalizer-compatible facade's, which
start with `rofu.service.personalizer.schemas.PREFIX` (/personalizer/v1.0); /healthz, /readyz
and /metrics (for probes and scrapers, not clients) do not. The prefix is part of each
router's own prefix, so a route's path (the metrics' `endpoint` label) is the whole path.
"""

API_PREFIX = "/v1"
