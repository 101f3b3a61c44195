"""sluice's benchmarks and the soak, each run from the checkout's root as a module: `python -m bench.<name>`
(bench/README.md lists them). One package per tool of several files; what several tools measure alike is in
bench/measures.py (percentiles), bench/cpu.py (CPU and memory from /proc) and bench/checkouts.py (the checkout,
another commit's worktree, a benchmark run in a child process)."""
