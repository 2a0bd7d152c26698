"""The cleanup floor: a policy's runs, from the cutoff to the last window.
``service`` holds the Cleanup service (runs, the planner's pages, windows,
partitions, pacing, preview); ``target`` the statements on the policy's table
and how its timestamps are read; ``windows`` how a run splits its rows;
``runs`` finishing and reading runs. It sits on the queue floor."""
