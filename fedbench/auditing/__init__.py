"""Privacy auditing by one training run (Steinke, Nasr & Jagielski, NeurIPS 2023): an empirical
epsilon lower bound for a board row, to compare with its formal epsilon.

- `bound`: the p-value and the epsilon lower bound from (m, guesses, correct), and the search over
  guessing rules with its Bonferroni correction (pure functions);
- `canaries`: the canaries and their coins;
- `training`: the row's FL training with the included canaries, and their black-box scores;
- `audit`: `audit_spec(spec) -> AuditResult`, cached in the run cache's artifact store.

`fedbench audit` is the command line. `fedbench.metrics.audit` is a different audit: the threshold
test of a membership attack's scores (Jagielski et al. 2020), computed on membership rows.
"""

from fedbench.auditing.audit import AuditConfig, AuditResult, audit_spec
from fedbench.auditing.bound import epsilon_lower_bound, p_value, search_guesses

__all__ = ["AuditConfig", "AuditResult", "audit_spec", "epsilon_lower_bound", "p_value", "search_guesses"]
