"""`dtrain run`: one job file on this machine, one process gang per node, the same render and policy as the operator."""
