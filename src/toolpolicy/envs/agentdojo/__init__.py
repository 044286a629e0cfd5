"""AgentDojo's four suites (workspace, travel, banking, slack), loaded from the installed package.

package.py  suites, tools, attack texts and the suites' own checks, from `agentdojo`
facts.py    what the gate knows when an episode starts: the request, the user's records
replay.py   the gate replay of every ground-truth call, per suite, gate off and on
env.py      `env: agentdojo`: a suite under an attack through the rollout engine

The shipped policies are examples/policies/agentdojo/<suite>.yaml; docs/agentdojo.md has
the figures.
"""

from toolpolicy.envs.agentdojo.package import ATTACKS, BENCHMARK_VERSION, SUITES

__all__ = ["ATTACKS", "BENCHMARK_VERSION", "SUITES"]
