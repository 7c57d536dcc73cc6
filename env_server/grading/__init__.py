"""Grading a submission with checks the agent never saw: the grader (`grader`), the host-side judge
of call tables (`call_checks`), canary tests (`canaries`), the reward-hacking monitor (`monitor`),
and the programs copied into the grading sandbox (`in_sandbox`)."""
