"""The k controller: per step, how many tokens to draft (0 = plain decoding), from what it learns.

`policy.KController` decides (start-up, refresh, the best k, exploring, holding plain) and holds the
parts it learns with: `costs` (the target's verify cost by batch size, the shared EWMA and fit
rules, a warm start's record giving way to today's timings), `draft_costs` (the draft model's
drafting and catch-up costs), `alpha` (acceptance overall and per draft position, change detection)
`probes` (when to speculate while plain wins, and testing a warm start's verdict at a bounded price) and `trees` (`--tree auto`: sibling acceptance by rank
and whether a tree beats the chain).

May import: numpy, `localspec.decoding.lookup`, and the top-level `localspec.config`,
`localspec.machine` and `localspec.tokens`. Must never import the engine, the loading layer, the
CLI, the server, bench, doctor or the UI: the controller sees only the timings and counts the
decoder reports.
"""

from .alpha import ALPHA_PRIOR, ALPHA_PRIOR_WEIGHT, expected_tokens
from .costs import WARM_TRUST
from .policy import REFRESH_PLAIN, KController
from .probes import EXPLORE_FIRST

__all__ = ["ALPHA_PRIOR", "ALPHA_PRIOR_WEIGHT", "EXPLORE_FIRST", "REFRESH_PLAIN", "WARM_TRUST", "KController",
           "expected_tokens"]
