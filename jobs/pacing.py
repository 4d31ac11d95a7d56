"""At most ``--max-rate`` requests a second from a job, retries and probes included.

The batcher already keeps best-effort work off its online traffic's latency, so a job needs no
cap to be safe there. A cap is for what the batcher cannot see: an endpoint shared with other
teams' jobs, a gateway that bills or throttles by request, a budget for the job's share of a
fleet. Sends are spaced evenly (no bursts after a quiet spell: a quiet spell is usually a
throttle lifting, when a burst is least welcome).

Pure state, no clock and no I/O: callers pass in the time and sleep what they are told.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RatePacer:
    """Spaces sends ``1 / rate`` seconds apart; a ``rate`` of 0 never holds one back."""

    rate: float
    _next_at: float = field(init=False, default=-math.inf)

    def reserve(self, now: float) -> float:
        """Seconds to wait from ``now`` before sending; the send's slot is taken at once, so
        requests that ask together are spread over the following slots."""
        if self.rate <= 0:
            return 0.0
        send_at = max(now, self._next_at)
        self._next_at = send_at + 1.0 / self.rate
        return send_at - now
